//! Prints the fenced module of a PTX file, or why it is refused:
//! `cargo run -p tensor-wasm-ptx-verify --example fence_file -- FILE.ptx`.

fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: fence_file FILE.ptx");
        std::process::exit(2);
    };
    let ptx = std::fs::read_to_string(&path).expect("a readable PTX file");
    match tensor_wasm_ptx_verify::fence(&ptx) {
        Ok(fenced) => print!("{}", fenced.ptx),
        Err(refusal) => {
            eprintln!("refused: {refusal}");
            std::process::exit(1);
        }
    }
}
