/* Pieces of gerbil serve's HTTP side that need no server: the API key comparison and the
 * split of a thinking model's text into reasoning_content and content, finished and while
 * streaming (a tag split across pieces never leaks to the wrong side). */
#include "serve/server.h"
#include "test.h"

#include <string.h>

static void split(const char *t, int think, int final, const char *want_r, const char *want_c) {
    size_t r0, r1, c0, c1;
    srv_think_split(t, strlen(t), think, final, &r0, &r1, &c0, &c1);
    CHECKF(r1 - r0 == strlen(want_r) && !memcmp(t + r0, want_r, r1 - r0), "\"%s\": reasoning \"%.*s\", want \"%s\"", t,
           (int)(r1 - r0), t + r0, want_r);
    CHECKF(c1 - c0 == strlen(want_c) && !memcmp(t + c0, want_c, c1 - c0), "\"%s\": content \"%.*s\", want \"%s\"", t,
           (int)(c1 - c0), t + c0, want_c);
}

int main(void) {
    CHECK(srv_key_equal("secret", 6, "secret"));
    CHECK(!srv_key_equal("secreT", 6, "secret"));
    CHECK(!srv_key_equal("secret2", 7, "secret"));
    CHECK(!srv_key_equal("secre", 5, "secret"));
    CHECK(!srv_key_equal("", 0, "secret"));

    split("Hello there", 0, 1, "", "Hello there");
    split("<think>\nplan it\n</think>\n\nThe answer", 0, 1, "plan it", "The answer");
    split("plan it\n</think>\n\nThe answer", 1, 1, "plan it", "The answer");   /* the prompt opened <think> */
    split("<think>\n\n</think>\n\nJust content", 0, 1, "", "Just content");     /* thinking switched off */
    /* streaming: partial tags are held back */
    split("<thi", 0, 0, "", "");
    split("<think>\nplan", 0, 0, "plan", "");
    split("<think>\nplan</th", 0, 0, "plan", "");
    split("<think>\nplan</think>", 0, 0, "plan", "");
    split("<think>\nplan</think>\n\nA", 0, 0, "plan", "A");
    split("<thi", 0, 1, "", "<thi");                                          /* final: it was text */
    split("I think <think> is a tag", 0, 1, "", "I think <think> is a tag");  /* only at the start */
    return test_done();
}
