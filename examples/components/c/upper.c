/* A WASI 0.2 command in C (world ../upper.wit: exports wasi:cli/run), with bindings generated
 * by wit-bindgen: stdin copied to stdout upper-cased, through wasi:io streams. "boom" on stdin
 * traps; "spin" never ends. */
#include <stdlib.h>
#include <string.h>

#include "upper.h"

bool exports_wasi_cli_run_run(void) {
    wasi_cli_stdin_own_input_stream_t in = wasi_cli_stdin_get_stdin();
    wasi_cli_stdout_own_output_stream_t out = wasi_cli_stdout_get_stdout();
    wasi_io_streams_borrow_input_stream_t source = wasi_io_streams_borrow_input_stream(in);
    wasi_io_streams_borrow_output_stream_t sink = wasi_io_streams_borrow_output_stream(out);
    for (bool first = true;; first = false) {
        upper_list_u8_t chunk;
        wasi_io_streams_stream_error_t err;
        if (!wasi_io_streams_method_input_stream_blocking_read(source, 4096, &chunk, &err)) {
            if (err.tag == WASI_IO_STREAMS_STREAM_ERROR_CLOSED) break;
            return false;
        }
        if (first && chunk.len >= 4 && memcmp(chunk.ptr, "boom", 4) == 0) abort();
        if (first && chunk.len >= 4 && memcmp(chunk.ptr, "spin", 4) == 0)
            for (volatile int forever = 1; forever;) {
            }
        for (size_t i = 0; i < chunk.len; i++)
            if (chunk.ptr[i] >= 'a' && chunk.ptr[i] <= 'z') chunk.ptr[i] -= 'a' - 'A';
        if (!wasi_io_streams_method_output_stream_blocking_write_and_flush(sink, &chunk, &err))
            return false;
        upper_list_u8_free(&chunk);
    }
    wasi_io_streams_input_stream_drop_own(in);
    wasi_io_streams_output_stream_drop_own(out);
    return true;
}
