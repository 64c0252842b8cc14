/* ticker: a WASI command that writes lines to stdout over time, for
 * POST /functions/{id}/invoke-stream. stdin: "COUNT DELAY_MS [EXIT_CODE]"
 * (default "3 500 0"). Writes COUNT lines, DELAY_MS apart, each flushed at
 * once and stamped with the wall clock:
 *   tick 1/3 unix_ns=1700000000123456789
 * then a last line "done unix_ns=..." just before exiting with EXIT_CODE.
 * Build:
 *   clang --target=wasm32-wasi -O2 ticker.c -o ticker.wasm
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long long unix_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(void) {
    int count = 3, delay_ms = 500, exit_code = 0;
    if (scanf("%d %d %d", &count, &delay_ms, &exit_code) < 0) {
        /* empty stdin: the defaults */
    }
    for (int i = 1; i <= count; i++) {
        if (i > 1) {
            struct timespec nap = {delay_ms / 1000, (long)(delay_ms % 1000) * 1000000L};
            nanosleep(&nap, NULL);
        }
        printf("tick %d/%d unix_ns=%lld\n", i, count, unix_ns());
        /* stdout is not a terminal, hence fully buffered: flush every line. */
        if (fflush(stdout) != 0) {
            return 2;
        }
    }
    printf("done unix_ns=%lld\n", unix_ns());
    fprintf(stderr, "ticker: %d lines\n", count);
    return exit_code;
}
