/* spec_rows MODEL: milliseconds of one forward of n = 1, 2, 4, 6 rows of one sequence after 32 positions,
 * as prefill rows and as verify rows (gerbil_batch.verify), best of 3: what a verify step costs
 * against a single decode (2 threads). */
#include "gerbil.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int c, char**v){
  if(c<2){fprintf(stderr,"usage: spec_rows MODEL\n");return 2;}
  gerbil_model_params mp=gerbil_model_default_params(); mp.n_threads=2; gerbil_model_t m;
  if(gerbil_model_load(v[1],&mp,&m)){puts(gerbil_last_error());return 1;}
  gerbil_context_params cp=gerbil_context_default_params(); cp.n_ctx=512; gerbil_context_t cx; gerbil_context_new(m,&cp,&cx);
  int32_t s; gerbil_seq_new(cx,&s); int32_t tok[64], sq[64]; int8_t one[64];
  for(int i=0;i<64;i++){tok[i]=i*7+3;sq[i]=s;one[i]=1;}
  gerbil_batch b={.n_rows=32,.tokens=tok,.seq=sq}; gerbil_context_eval(cx,&b);
  int ns[]={1,2,4,6}; 
  for(int mode=0;mode<3;mode++) for(int k=0;k<4;k++){ int n=ns[k]; double best=1e9;
    for(int r=0;r<3;r++){ gerbil_seq_checkpoint(cx,s); double t0=now();
      gerbil_batch bb={.n_rows=n,.tokens=tok,.seq=sq,.logits=mode==2?NULL:one,.verify=mode?one:NULL}; gerbil_context_eval(cx,&bb);
      double t=now()-t0; if(t<best)best=t; gerbil_seq_truncate(cx,s,32);}
    printf("%s n=%d: %.1f ms\n", mode==0?"prefill-rows(all logits)":mode==1?"verify(all logits)":"verify(last logits)", n, best*1e3);}
  return 0;}
