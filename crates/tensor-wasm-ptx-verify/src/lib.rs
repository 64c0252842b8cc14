//! The PTX verifier and fencing rewrite for tenant kernels.
//!
//! [`fence`] takes a tenant's PTX module (NVRTC's output, or hand-written) and either
//! refuses it — naming the instruction, its line and why — or returns a rewritten module
//! that can touch only the memory its launch was given and that ends soon after its
//! invocation's deadline. What it checks:
//!
//! - **The subset.** The module must be PTX the interpreter runs
//!   ([`tensor_wasm_ptx_emu::Module::parse`]): anything else — indirect branches
//!   (`brx.idx`) and calls through a register, calls of `.extern` functions, textures,
//!   surfaces, bulk and tensor-memory copies, `.const` and other state spaces, float
//!   atomics, approximate math — is refused with its line.
//! - **Uniform collectives.** A `bar.sync` or warp operation (or a call of a function that
//!   reaches one) that only some threads of a block may reach is refused: it depends on a
//!   branch whose condition differs between threads (see `cfg.rs`). A thread stuck there
//!   would never reach a cancellation poll.
//! - **Escaping local memory.** `cvta.local` (a local array's generic address) is refused,
//!   so every generic address is global or shared.
//!
//! What it rewrites:
//!
//! - **Fences.** Every global or generic load, store and atomic is confined to the launch's
//!   window `[lo, hi)` (the guest's memory); a generic address in the shared window to the
//!   block's shared memory; shared accesses through a register to the block's shared
//!   memory, from the lowest shared variable to the end of the highest (the device may
//!   reserve the start of the shared window, so it is not `[0, size)`); local accesses
//!   through a register to the function's own `.local` variable. The fence
//!   *clamps* an address into its range and aligns it down to the access size: a stray
//!   access lands inside the tenant's own memory and never faults (a fault would end the
//!   whole context, other launches in it included), and no path through the kernel
//!   changes, so barriers stay uniform. Accesses to a variable at a constant offset are
//!   proven in bounds instead (or refused when they are not).
//! - **Polls.** Before every backward branch and at every `.func` entry the thread tests
//!   the cancel word as the previous poll read it, exits if it was non-zero, and reads it
//!   again (`ld.volatile.global.u32`) for the next poll: the read's latency overlaps the
//!   loop body. Between two polls a thread runs at most one pass through straight-line
//!   code, so a runaway kernel ends within two loop iterations of the host setting the word.
//! - **Hidden parameters.** Every entry takes four more `.u64` parameters,
//!   [`HIDDEN_PARAMS`], after its own: the window's first byte and end, the launch's dynamic
//!   shared bytes (at least 16), and the cancel word's address. Every function takes
//!   [`FUNCTION_PARAMS`], which calls pass on: the window, the block's shared memory as the
//!   entry bounded it, the cancel word.

mod arith;
mod cfg;
mod decode;
mod fence;
mod frame;
mod group;
mod lean;
mod origin;
mod prove;
mod text;
mod value;

pub use lean::LEAN_PREFIX;
pub use prove::{LaunchFacts, Proof, PROOF_STEPS};

/// The parameters the rewrite appends to every entry, in order: the window's first byte,
/// its end (exclusive), the launch's dynamic shared memory in bytes (at least 16: see
/// [`dynamic_shared_bytes`]), and the address of the cancel word (a `u32` the kernel reads,
/// never writes).
pub const HIDDEN_PARAMS: [&str; 4] = ["__tw_lo", "__tw_hi", "__tw_shared", "__tw_cancel"];

/// Why a module was refused: the instruction, its line, and the rule it breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("PTX line {line}: `{instruction}`: {reason}")]
pub struct Refusal {
    /// 1-based line of the instruction.
    pub line: u32,
    /// The instruction as written (whitespace collapsed).
    pub instruction: String,
    /// What is wrong with it.
    pub reason: String,
}

/// A fenced module.
#[derive(Debug, Clone)]
pub struct Fenced {
    /// The rewritten PTX.
    pub ptx: String,
    /// Its entries.
    pub kernels: Vec<String>,
    /// Accesses given a fence.
    pub fences: u32,
    /// Cancellation polls inserted.
    pub polls: u32,
    /// Accesses proven in bounds (a variable at a constant offset), left as they were.
    pub proven: u32,
    /// Accesses covered by the fence of an earlier access through the same register.
    pub grouped: u32,
}

/// Most instructions (all threads together: threads × the longest path) a proven launch
/// whose threads take a backward branch may run. Its lean entry has no cancellation poll,
/// so this is what may still run after its invocation's deadline; a larger launch runs the
/// fenced entry, which polls at every backward branch. A launch without loops is not bound
/// by it: its fenced entry has no poll on its paths either.
pub const LEAN_WORK_LIMIT: u64 = 1 << 36;

/// Why a launch was not proven: the first instruction the proof could not clear.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("PTX line {line}: {reason}")]
pub struct Unproven {
    /// 1-based line of the instruction in the fenced module (0: none in particular).
    pub line: u32,
    pub reason: String,
}

/// The launch-time proof for one entry of a fenced module: [`Plan::admit`] decides, per
/// launch, whether the tenant's own entry (the *lean* copy, [`Plan::lean_entry`]) may run
/// instead of the fenced one — with the same parameters, hidden ones included.
///
/// A launch is proven when, for its parameters, grid, block, dynamic shared memory and
/// window, an abstract execution of the lean entry over every thread at once shows every
/// global and generic access inside the window and every shared and local access inside
/// its variable, each aligned to its size, and every thread ending within
/// [`PROOF_STEPS`] instructions (so no cancellation poll is needed). Verdicts are cached
/// per launch description (at most [`Plan::CACHED_VERDICTS`]).
pub struct Plan {
    funcs: Vec<decode::Func>,
    vars: Vec<decode::Var>,
    entry: usize,
    lean_entry: String,
    verdicts: std::sync::Mutex<std::collections::HashMap<Vec<u8>, Result<Proof, Unproven>>>,
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("lean_entry", &self.lean_entry)
            .finish_non_exhaustive()
    }
}

impl Plan {
    /// Verdicts one plan keeps; a full cache starts over.
    pub const CACHED_VERDICTS: usize = 256;

    /// The plan for `entry` of a module [`fence`] produced; `None` when the module has no
    /// lean copy of it (then every launch runs fenced).
    pub fn new(fenced_ptx: &str, entry: &str) -> Option<Plan> {
        let text = text::read(fenced_ptx)?;
        let lean_entry = format!("{LEAN_PREFIX}{entry}");
        let lean: Vec<&text::Function> = text
            .functions
            .iter()
            .filter(|f| f.name.starts_with(LEAN_PREFIX))
            .collect();
        let entry = lean.iter().position(|f| f.entry && f.name == lean_entry)?;
        let (funcs, vars) = decode::decode(&text, &lean)?;
        Some(Plan {
            funcs,
            vars,
            entry,
            lean_entry,
            verdicts: Default::default(),
        })
    }

    /// The lean entry's name.
    pub fn lean_entry(&self) -> &str {
        &self.lean_entry
    }

    /// Whether this launch may run the lean entry.
    ///
    /// # Errors
    /// [`Unproven`] naming the first access or loop the proof could not clear; the launch
    /// then runs the fenced entry.
    pub fn admit(&self, facts: &LaunchFacts<'_>) -> Result<Proof, Unproven> {
        let mut key = Vec::new();
        for p in facts.params {
            key.extend((p.len() as u64).to_le_bytes());
            key.extend(p);
        }
        for d in facts.grid.iter().chain(&facts.block) {
            key.extend(d.to_le_bytes());
        }
        key.extend(facts.dynamic_shared.to_le_bytes());
        key.extend(facts.window.0.to_le_bytes());
        key.extend(facts.window.1.to_le_bytes());
        let cached = self
            .verdicts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&key)
            .cloned();
        if let Some(verdict) = cached {
            return verdict;
        }
        let verdict = self.prove_uncached(facts);
        let mut verdicts = self
            .verdicts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if verdicts.len() >= Self::CACHED_VERDICTS {
            verdicts.clear();
        }
        verdicts.insert(key, verdict.clone());
        verdict
    }

    /// [`Plan::admit`] without its cache (to time the proof).
    ///
    /// # Errors
    /// As [`Plan::admit`].
    pub fn prove_uncached(&self, facts: &LaunchFacts<'_>) -> Result<Proof, Unproven> {
        if facts.grid.iter().chain(&facts.block).any(|&d| d == 0) {
            return Err(Unproven {
                line: 0,
                reason: "an empty grid or block".into(),
            });
        }
        let proof = prove::Prover {
            funcs: &self.funcs,
            vars: &self.vars,
            entry: self.entry,
            facts: *facts,
        }
        .run()
        .map_err(|(line, reason)| Unproven { line, reason })?;
        // A lean entry has no polls: a launch whose threads loop must end soon on its own.
        let threads: u128 = facts
            .grid
            .iter()
            .chain(&facts.block)
            .map(|&d| u128::from(d))
            .product();
        let work = threads * u128::from(proof.longest);
        if proof.rounds > 0 && work > u128::from(LEAN_WORK_LIMIT) {
            return Err(Unproven {
                line: 0,
                reason: format!(
                    "{threads} threads of up to {} instructions each exceed the {LEAN_WORK_LIMIT} \
                     instructions a launch with loops may run without cancellation polls",
                    proof.longest
                ),
            });
        }
        Ok(proof)
    }
}

/// Verifies `ptx` and rewrites it with fences and polls.
///
/// # Errors
/// A [`Refusal`] naming the first instruction that breaks a rule.
pub fn fence(ptx: &str) -> Result<Fenced, Refusal> {
    tensor_wasm_ptx_emu::Module::parse(ptx).map_err(|error| subset_refusal(ptx, error))?;
    refuse_reserved_names(ptx)?;
    let text = text::read(ptx).ok_or_else(|| Refusal {
        line: 1,
        instruction: String::new(),
        reason: "the module's layout could not be read".into(),
    })?;
    let mut fenced = fence::Rewriter::new(ptx, &text).run()?;
    if let Some(copy) = lean::copy(ptx, &text) {
        fenced.ptx.push_str(
            "\n// The tenant's own functions, renamed: a launch runs one of these entries only \
             when tensor-wasm-ptx-verify's Plan::admit proves it safe.\n",
        );
        fenced.ptx.push_str(&copy);
    }
    // The rewrite must itself be PTX the interpreter accepts: a failure here is ours.
    if let Err(error) = tensor_wasm_ptx_emu::Module::parse(&fenced.ptx) {
        return Err(Refusal {
            line: 0,
            instruction: String::new(),
            reason: format!("internal error: the fenced module does not parse: {error}"),
        });
    }
    Ok(fenced)
}

/// The prefixes of the names the rewrite declares (registers, parameters, variables).
/// Tenant text may not use them: a tenant register named like one of the rewrite's, declared
/// in an inner `{ }` scope, would shadow it in the fences placed there.
pub const RESERVED_PREFIXES: [&str; 3] = ["%tw_", "__tw_", "$tw_"];

fn refuse_reserved_names(ptx: &str) -> Result<(), Refusal> {
    let tokens = tensor_wasm_ptx_emu::lex::lex(ptx).map_err(|error| subset_refusal(ptx, error))?;
    for token in tokens {
        let tensor_wasm_ptx_emu::lex::Tok::Word(word) = &token.tok else {
            continue;
        };
        if RESERVED_PREFIXES
            .iter()
            .any(|prefix| word.starts_with(prefix))
        {
            return Err(Refusal {
                line: token.line,
                instruction: word.clone(),
                reason: format!(
                    "names starting with {} are reserved for the fencing rewrite",
                    RESERVED_PREFIXES.join(", ")
                ),
            });
        }
    }
    Ok(())
}

/// Verifies `ptx` without keeping the rewrite.
///
/// # Errors
/// As [`fence`].
pub fn verify(ptx: &str) -> Result<(), Refusal> {
    fence(ptx).map(|_| ())
}

/// The parameters the rewrite appends to every `.func`, in order (calls pass them on): the
/// window's first byte and end, the block's shared memory from its first byte to its end
/// (as the entry computed them), and the cancel word's address.
pub const FUNCTION_PARAMS: [&str; 5] = [
    "__tw_lo",
    "__tw_hi",
    "__tw_shared_lo",
    "__tw_shared_hi",
    "__tw_cancel",
];

/// The 16-byte shared variable the rewrite declares in every module, so that every fenced
/// kernel has shared memory to bound generic shared addresses by.
pub const SHARED_PAD: &str = "__tw_shared_pad";

/// The dynamic shared memory to launch a fenced kernel with, for `requested` bytes: at
/// least 16, so that a kernel's dynamic array is never empty.
pub fn dynamic_shared_bytes(requested: u32) -> u32 {
    requested.max(16)
}

/// The values of [`HIDDEN_PARAMS`] for a launch: window `lo..hi` (16-byte aligned), the
/// dynamic shared bytes the launch is given (see [`dynamic_shared_bytes`]), the cancel
/// word's address.
pub fn hidden_args(lo: u64, hi: u64, dynamic_shared: u32, cancel_word: u64) -> [u64; 4] {
    [lo, hi, u64::from(dynamic_shared), cancel_word]
}

fn subset_refusal(ptx: &str, error: tensor_wasm_ptx_emu::EmuError) -> Refusal {
    use tensor_wasm_ptx_emu::EmuError;
    let (line, reason) = match &error {
        EmuError::Unsupported { line, what } => {
            (*line, format!("not in the accepted subset: {what}"))
        }
        EmuError::Parse { line, message } => (*line, format!("malformed PTX: {message}")),
        other => (0, other.to_string()),
    };
    let instruction = ptx
        .lines()
        .nth(line.saturating_sub(1) as usize)
        .unwrap_or("")
        .split("//")
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    Refusal {
        line,
        instruction,
        reason,
    }
}
