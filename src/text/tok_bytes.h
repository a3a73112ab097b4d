/* The bytes each token id contributes to the output text, for byte-level work over the
 * vocabulary (the grammar engine's token trie). */
#ifndef GB_TOK_BYTES_H
#define GB_TOK_BYTES_H

#include "gerbil.h"

#include <stddef.h>
#include <stdint.h>

/* The raw bytes of token id (mode from tok_bytes_mode) written to *out (malloc'd, may be NULL when *len = 0):
 *  - byte-level BPE (GPT-2 byte alphabet): each character mapped back to its byte;
 *  - SentencePiece-style (Metaspace / byte fallback): "▁" is a space, <0xNN> the byte NN;
 *  - other models: the token string as is;
 *  - added tokens: their content; *special = 1 for special added tokens.
 * Returns -1 when id has no token (out of range, unused id). */
enum { TOK_BYTES_TEXT = 0, TOK_BYTES_BYTE_LEVEL = 1 };
/* How the vocabulary's strings map to bytes (one pass over the vocabulary). */
int tok_bytes_mode(gerbil_tokenizer_t tok);
int tok_token_bytes(gerbil_tokenizer_t tok, int mode, int32_t id, char **out, size_t *len, int *special);

#endif
