/* wordcount: a WASI command that counts lines, words and bytes of stdin,
 * like `wc`, and reports them as JSON on stdout. Build:
 *   clang --target=wasm32-wasi -O2 wordcount.c -o wordcount.wasm
 */
#include <ctype.h>
#include <stdio.h>

int main(void) {
    unsigned long lines = 0, words = 0, bytes = 0;
    int in_word = 0;
    int c;
    while ((c = getchar()) != EOF) {
        bytes++;
        if (c == '\n') lines++;
        if (isspace(c)) {
            in_word = 0;
        } else if (!in_word) {
            in_word = 1;
            words++;
        }
    }
    fprintf(stderr, "wordcount: read %lu bytes\n", bytes);
    printf("{\"lines\": %lu, \"words\": %lu, \"bytes\": %lu}\n", lines, words, bytes);
    return words == 0 ? 3 : 0;
}
