//! Prints the fenced module of a PTX file, or why it is refused:
//! `cargo run -p tensor-wasm-ptx-verify --example fence_file -- FILE.ptx`, or `-- FILE.cu ENTRY`
//! for CUDA C++ (NVRTC's PTX for sm_80).

fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: fence_file FILE.ptx | fence_file FILE.cu ENTRY");
        std::process::exit(2);
    };
    let text = std::fs::read_to_string(&path).expect("a readable file");
    // CUDA C++ (`FILE.cu ENTRY`): NVRTC's PTX for sm_80 first.
    let ptx = if path.ends_with(".cu") {
        let entry = std::env::args()
            .nth(2)
            .expect("usage: fence_file FILE.cu ENTRY");
        tensor_wasm_gpu::compile_cuda(&text, &entry, (8, 0))
            .expect("NVRTC compiles it")
            .ptx
    } else {
        text
    };
    match tensor_wasm_ptx_verify::fence(&ptx) {
        Ok(fenced) => print!("{}", fenced.ptx),
        Err(refusal) => {
            eprintln!("refused: {refusal}");
            std::process::exit(1);
        }
    }
}
