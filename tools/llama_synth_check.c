// llama.cpp's view of a GGUF (e.g. a `hearth synth` file): load it, prefill PROMPT (specials parsed,
// BOS as the model says), print one JSON line {"prompt", "top": 10 [id, logit], "greedy": 8 ids} to
// set beside `hearth logits` (same fields). Build against a llama.cpp checkout L with build/bin/libllama:
//   gcc -O2 -o llama_synth_check tools/llama_synth_check.c -I$L/include -I$L/ggml/include \
//       -L$L/build/bin -lllama -Wl,-rpath,$L/build/bin
//   ./llama_synth_check model.gguf $'<|im_start|>user\nhello<|im_end|>'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llama.h"
static void top10(const float *lg, int n, int *ids) {
    for (int k = 0; k < 10; k++) { int b = -1; for (int i = 0; i < n; i++) { int used = 0; for (int j = 0; j < k; j++) if (ids[j] == i) used = 1; if (!used && (b < 0 || lg[i] > lg[b])) b = i; } ids[k] = b; }
}
int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: %s MODEL PROMPT\n", argv[0]); return 2; }
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *m = llama_model_load_from_file(argv[1], mp);
    if (!m) { fprintf(stderr, "load failed\n"); return 1; }
    const struct llama_vocab *v = llama_model_get_vocab(m);
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 512; cp.n_batch = 512; cp.n_threads = 2; cp.n_threads_batch = 2;
    struct llama_context *ctx = llama_init_from_model(m, cp);
    if (!ctx) { fprintf(stderr, "context failed\n"); return 1; }
    int toks[512];
    int n = llama_tokenize(v, argv[2], strlen(argv[2]), toks, 512, true, true);
    int nv = llama_vocab_n_tokens(v);
    printf("{\"prompt\":[");
    for (int i = 0; i < n; i++) printf("%s%d", i ? "," : "", toks[i]);
    printf("]");
    if (llama_decode(ctx, llama_batch_get_one(toks, n))) { fprintf(stderr, "decode failed\n"); return 1; }
    const float *lg = llama_get_logits_ith(ctx, -1);
    int ids[10]; top10(lg, nv, ids);
    printf(",\"top\":[");
    for (int k = 0; k < 10; k++) printf("%s[%d,%.5f]", k ? "," : "", ids[k], lg[ids[k]]);
    printf("],\"greedy\":[");
    int t = ids[0];
    for (int g = 0; g < 8; g++) {
        printf("%s%d", g ? "," : "", t);
        if (llama_decode(ctx, llama_batch_get_one(&t, 1))) { fprintf(stderr, "decode failed\n"); return 1; }
        lg = llama_get_logits_ith(ctx, -1); top10(lg, nv, ids); t = ids[0];
    }
    printf("]}\n");
    llama_free(ctx); llama_model_free(m);
    return 0;
}
