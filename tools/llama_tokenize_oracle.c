// llama.cpp tokenization oracle for tools/gen_tokenizer_vectors.py --llama-cpp.
//
// Build against a llama.cpp checkout, e.g. vendor/llama.cpp of PyPI's llama-cpp-python 0.3.36 sdist
// (cmake from PyPI works), from that directory:
//   cmake -B build -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DLLAMA_CURL=OFF
//         -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF
//     (one command)
//   cmake --build build --target llama -j2
//   cc -O2 -I include -I ggml/include $HEARTH/tools/llama_tokenize_oracle.c -L build/bin -lllama
//      -Wl,-rpath,$PWD/build/bin -o /tmp/oracle   (one command)
// Usage: oracle MODEL.gguf < records > results
//   record in:  u8 add_special, u8 parse_special, u32 len, len bytes of UTF-8 (little-endian)
//   record out: i32 n, n x i32 token ids, i32 m, m bytes of llama_detokenize(ids,
//               remove_special = false, unparse_special = parse_special)
// or:    oracle MODEL.gguf --info
//   prints one JSON line: special ids, add_bos / add_eos, the end-of-generation ids, and FNV-1a 64
//   hashes over all tokens of the attributes (u32) and of token_to_piece with and without
//   special rendering (u32 length + bytes each).
#include "llama.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t fnv(uint64_t h, const void * data, size_t n) {
    const unsigned char * p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ULL;
    }
    return h;
}

static uint64_t piece_hash(const struct llama_vocab * vocab, int special) {
    uint64_t h = 14695981039346656037ULL;
    char buf[4096];
    for (int32_t t = 0; t < llama_vocab_n_tokens(vocab); t++) {
        int32_t n = llama_token_to_piece(vocab, t, buf, sizeof(buf), 0, special);
        uint32_t len = n < 0 ? 0 : (uint32_t) n;
        h = fnv(h, &len, 4);
        h = fnv(h, buf, len);
    }
    return h;
}

static void info(const struct llama_vocab * vocab) {
    int32_t n = llama_vocab_n_tokens(vocab);
    uint64_t ha = 14695981039346656037ULL;
    for (int32_t t = 0; t < n; t++) {
        uint32_t a = (uint32_t) llama_vocab_get_attr(vocab, t);
        ha = fnv(ha, &a, 4);
    }
    printf("{\"n_tokens\":%d,\"bos\":%d,\"eos\":%d,\"eot\":%d,\"pad\":%d,\"add_bos\":%s,\"add_eos\":%s,",
           n, llama_vocab_bos(vocab), llama_vocab_eos(vocab), llama_vocab_eot(vocab), llama_vocab_pad(vocab),
           llama_vocab_get_add_bos(vocab) ? "true" : "false", llama_vocab_get_add_eos(vocab) ? "true" : "false");
    printf("\"eog\":[");
    int first = 1;
    for (int32_t t = 0; t < n; t++) {
        if (llama_vocab_is_eog(vocab, t)) {
            printf(first ? "%d" : ",%d", t);
            first = 0;
        }
    }
    printf("],\"attr_fnv\":\"%016llx\",\"piece_special_fnv\":\"%016llx\",\"piece_plain_fnv\":\"%016llx\"}\n",
           (unsigned long long) ha, (unsigned long long) piece_hash(vocab, 1),
           (unsigned long long) piece_hash(vocab, 0));
}

static void quiet(enum ggml_log_level level, const char * text, void * user) {
    (void) level; (void) text; (void) user;
}

int main(int argc, char ** argv) {
    if (argc != 2 && !(argc == 3 && strcmp(argv[2], "--info") == 0)) {
        fprintf(stderr, "usage: %s MODEL.gguf [--info] < records > results\n", argv[0]);
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
    if (argc == 3) {
        info(vocab);
        llama_model_free(model);
        return 0;
    }
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
        int32_t dcap = (int32_t) len * 2 + 64;
        char * det = malloc(dcap);
        int32_t m = llama_detokenize(vocab, toks, n, det, dcap, false, flags[1]);
        if (m < 0) {
            dcap = -m;
            det = realloc(det, dcap);
            m = llama_detokenize(vocab, toks, n, det, dcap, false, flags[1]);
        }
        fwrite(&m, 4, 1, stdout);
        fwrite(det, 1, m > 0 ? m : 0, stdout);
        free(det);
        free(text);
        free(toks);
    }
    llama_model_free(model);
    return 0;
}
