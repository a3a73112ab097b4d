/* Image input cost: decode of the shared photos and the Qwen3.5 image processor on a
 * 1024x768 photo (the cats PNG upscaled with gerbil's Pillow-exact bicubic), median of
 * N runs (default 9), one thread. Usage: bench_image [N] (from the repository root). */
#include "gerbil.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}
static int cmpd(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 9;
    if (n < 1 || n > 1000) n = 9;
    double *t = malloc(sizeof(double) * n);
    const char *files[] = {"../shared/data/images/coco_000000039769_two_cats.png",
                           "../shared/data/images/llamacpp_mtmd_test-1_newspaper.jpeg",
                           "../shared/data/images/llamacpp_ui_fixture_1_fjord.jpg"};
    for (int f = 0; f < 3; f++) {
        gerbil_image im = {0};
        for (int i = 0; i < n; i++) {
            gerbil_image_free(&im);
            double t0 = now_ms();
            if (gerbil_image_read_file(files[f], &im)) { fprintf(stderr, "%s\n", gerbil_last_error()); return 1; }
            t[i] = now_ms() - t0;
        }
        qsort(t, n, sizeof *t, cmpd);
        printf("decode %-55s %dx%d  %.2f ms\n", files[f], im.width, im.height, t[n / 2]);
        gerbil_image_free(&im);
    }
    gerbil_image src, photo;
    if (gerbil_image_read_file(files[0], &src) || gerbil_image_resize_bicubic(&src, 1024, 768, &photo)) {
        fprintf(stderr, "%s\n", gerbil_last_error());
        return 1;
    }
    gerbil_qwen_image_config c = {16, 2, 2, 65536, 16777216, 1.0 / 255, {0.5f, 0.5f, 0.5f}, {0.5f, 0.5f, 0.5f}};
    int64_t np = 0, pd = 0;
    int thw[3];
    for (int i = 0; i < n; i++) {
        float *pv;
        double t0 = now_ms();
        if (gerbil_image_qwen_patches(&photo, &c, &pv, &np, &pd, thw)) { fprintf(stderr, "%s\n", gerbil_last_error()); return 1; }
        t[i] = now_ms() - t0;
        free(pv);
    }
    qsort(t, n, sizeof *t, cmpd);
    printf("qwen3.5 image processor 1024x768 -> grid %dx%dx%d, %lld patches x %lld: %.2f ms\n", thw[0], thw[1], thw[2],
           (long long)np, (long long)pd, t[n / 2]);
    c.max_pixels = 640 * 480;
    for (int i = 0; i < n; i++) {
        float *pv;
        double t0 = now_ms();
        if (gerbil_image_qwen_patches(&photo, &c, &pv, &np, &pd, thw)) { fprintf(stderr, "%s\n", gerbil_last_error()); return 1; }
        t[i] = now_ms() - t0;
        free(pv);
    }
    qsort(t, n, sizeof *t, cmpd);
    printf("qwen3.5 image processor 1024x768, max_pixels 640*480 (bicubic downscale) -> grid %dx%dx%d: %.2f ms\n", thw[0],
           thw[1], thw[2], t[n / 2]);
    gerbil_image_free(&src);
    gerbil_image_free(&photo);
    free(t);
    return 0;
}
