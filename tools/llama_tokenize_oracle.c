// llama.cpp tokenization oracle for tools/gen_tokenizer_vectors.py --llama-cpp.
//
// Build against a llama.cpp checkout (e.g. the one vendored in PyPI's llama-cpp-python sdist):
//   cmake -B build -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF && cmake --build build --target llama
//   cc -O2 -I include -I ggml/include tools/llama_tokenize_oracle.c -L build/bin -lllama -o oracle
// Usage: oracle MODEL.gguf < records > results
//   record in:  u8 add_special, u8 parse_special, u32 len, len bytes of UTF-8 (little-endian)
//   record out: i32 n, n x i32 token ids
#include "llama.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static void quiet(enum ggml_log_level level, const char * text, void * user) {
    (void) level; (void) text; (void) user;
}

int main(int argc, char ** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL.gguf < records > results\n", argv[0]);
        return 2;
    }
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    struct llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    const struct llama_vocab * vocab = llama_model_get_vocab(model);
    for (;;) {
        uint8_t flags[2];
        uint32_t len;
        if (fread(flags, 1, 2, stdin) != 2) break;
        if (fread(&len, 4, 1, stdin) != 1) return 1;
        char * text = malloc(len + 1);
        if (len && fread(text, 1, len, stdin) != len) return 1;
        int32_t cap = (int32_t) len + 16;
        llama_token * toks = malloc(sizeof(llama_token) * cap);
        int32_t n = llama_tokenize(vocab, text, (int32_t) len, toks, cap, flags[0], flags[1]);
        if (n < 0) {
            cap = -n;
            toks = realloc(toks, sizeof(llama_token) * cap);
            n = llama_tokenize(vocab, text, (int32_t) len, toks, cap, flags[0], flags[1]);
        }
        fwrite(&n, 4, 1, stdout);
        fwrite(toks, sizeof(llama_token), n > 0 ? n : 0, stdout);
        free(text);
        free(toks);
    }
    llama_model_free(model);
    return 0;
}
