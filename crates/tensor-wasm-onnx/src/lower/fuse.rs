//! Fusion of element-wise chains: an `elementwise[..]` launch whose output only the next
//! element-wise launch reads (as its left operand, or either operand of an addition or a
//! multiplication, which commute) is merged into it as one `chain[..]`
//! launch, which computes the same operations in the same order with the same roundings, so
//! the bits do not change and one pass over memory is saved per fused step (a bias add and its
//! activation, a residual add and its scale). After fusion, every buffer's lifetime is
//! computed again from the launches that remain.

use tensor_wasm_jit::Blueprint;

use super::{Arg, BufferUse, Launch, Lowered, Slot};

/// Most operations one `chain[..]` runs, and most operand buffers it reads besides its input.
const MAX_OPS: usize = 4;
const MAX_OPERANDS: usize = 3;

/// An element-wise launch read as a chain: `out = ops(x, operands...)` over `n` elements.
#[derive(Debug, Clone, PartialEq)]
struct Chain {
    ops: Vec<&'static str>,
    x: Slot,
    operands: Vec<Slot>,
    out: Slot,
    n: u32,
    node: usize,
}

const UNARY: &[&str] = &["relu", "exp", "tanh", "sigmoid", "erf", "gelu", "rsqrt"];
const BINARY: &[&str] = &["add", "sub", "mul", "div", "max", "min"];

fn slot(arg: &Arg) -> Option<Slot> {
    match arg {
        Arg::Tensor(slot, _) => Some(*slot),
        _ => None,
    }
}

/// `launch` as a chain, when it is an element-wise kernel a chain can run.
fn chain_of(launch: &Launch) -> Option<Chain> {
    let descriptor = launch.blueprint.descriptor();
    // Canonical descriptors carry the dtype; chains are f32.
    let descriptor = descriptor.strip_suffix(":f32")?;
    if let Some(inner) = descriptor
        .strip_prefix("chain[")
        .and_then(|d| d.strip_suffix(']'))
    {
        let ops: Vec<&'static str> = inner
            .split('.')
            .map(|op| {
                UNARY
                    .iter()
                    .chain(BINARY)
                    .chain(&["neg"])
                    .find(|k| **k == op)
                    .copied()
            })
            .collect::<Option<_>>()?;
        let tensors: Vec<Slot> = launch.args.iter().filter_map(slot).collect();
        let (&out, rest) = tensors.split_last()?;
        let (&x, operands) = rest.split_first()?;
        let Some(Arg::U32(n)) = launch.args.last() else {
            return None;
        };
        return Some(Chain {
            ops,
            x,
            operands: operands.to_vec(),
            out,
            n: *n,
            node: launch.node,
        });
    }
    let op = descriptor.strip_prefix("elementwise[")?.strip_suffix(']')?;
    let op: &'static str = if op == "scale" {
        // Only a scale by -1 (a negation) has a chain operation.
        match launch.args.get(2) {
            Some(Arg::F32(alpha)) if *alpha == -1.0 => "neg",
            _ => return None,
        }
    } else {
        UNARY.iter().chain(BINARY).find(|k| **k == op).copied()?
    };
    let tensors: Vec<Slot> = launch.args.iter().filter_map(slot).collect();
    let Some(Arg::U32(n)) = launch.args.last() else {
        return None;
    };
    let (x, operands, out) = match tensors.as_slice() {
        [x, out] => (*x, vec![], *out),
        [a, b, out] => (*a, vec![*b], *out),
        _ => return None,
    };
    Some(Chain {
        ops: vec![op],
        x,
        operands,
        out,
        n: *n,
        node: launch.node,
    })
}

/// The `chain[..]` launch of `chain`, when its kernel exists.
fn launch_of(chain: &Chain) -> Option<Launch> {
    let blueprint = Blueprint::parse(&format!("chain[{}]", chain.ops.join("."))).ok()?;
    let shape = blueprint.shape(&[chain.n])?;
    let config = blueprint.launch_config(&shape).ok()?;
    let bytes = 4 * u64::from(chain.n);
    let mut args = vec![Arg::Tensor(chain.x, bytes)];
    args.extend(chain.operands.iter().map(|&s| Arg::Tensor(s, bytes)));
    args.push(Arg::Tensor(chain.out, bytes));
    args.push(Arg::U32(chain.n));
    Some(Launch {
        blueprint,
        config,
        args,
        node: chain.node,
    })
}

/// `next` with its operands swapped when it is one addition or multiplication reading
/// `target` as its right operand: `b + a` is `a + b` to the bit (IEEE 754 addition and
/// multiplication commute; only a NaN's payload, which the GPU does not keep either, may
/// differ), so the chain before it can fuse.
fn commuted(mut next: Chain, target: Slot) -> Chain {
    if next.x != target
        && next.operands == [target]
        && matches!(next.ops.as_slice(), ["add"] | ["mul"])
    {
        next.operands = vec![next.x];
        next.x = target;
    }
    next
}

fn touches(launch: &Launch, target: Slot) -> bool {
    launch.args.iter().any(|a| slot(a) == Some(target))
}

/// Fuses element-wise chains in `lowered` (see the module docs) and recomputes every
/// buffer's lifetime.
pub(super) fn fuse(lowered: &mut Lowered) {
    let outputs: Vec<Slot> = lowered.outputs.iter().map(|(s, _)| *s).collect();
    let mut launches: Vec<Launch> = std::mem::take(&mut lowered.launches);
    let mut i = 0;
    while i < launches.len() {
        let Some(first) = chain_of(&launches[i]) else {
            i += 1;
            continue;
        };
        let Slot::Buffer(_) = first.out else {
            i += 1;
            continue;
        };
        // The next launch touching the output must be the only reader, as its left operand.
        let Some(j) = (i + 1..launches.len()).find(|&k| touches(&launches[k], first.out)) else {
            i += 1;
            continue;
        };
        let later = (j + 1..launches.len()).any(|k| touches(&launches[k], first.out));
        let merged = chain_of(&launches[j])
            .map(|next| commuted(next, first.out))
            .filter(|next| {
                next.x == first.out
                    && next.n == first.n
                    && !next.operands.contains(&first.out)
                    // Later readers are fine when they read what the chain writes back.
                    && (!later || next.out == first.out)
                    && !outputs.contains(&first.out)
                    && first.ops.len() + next.ops.len() <= MAX_OPS
                    && first.operands.len() + next.operands.len() <= MAX_OPERANDS
                    // Every launch in between leaves the chain's buffers alone.
                    && (i + 1..j).all(|k| {
                        [first.x, next.out]
                            .iter()
                            .chain(&first.operands)
                            .chain(&next.operands)
                            .all(|&s| !touches(&launches[k], s))
                    })
            })
            .and_then(|next| {
                let chain = Chain {
                    ops: first.ops.iter().chain(&next.ops).copied().collect(),
                    x: first.x,
                    operands: first
                        .operands
                        .iter()
                        .chain(&next.operands)
                        .copied()
                        .collect(),
                    out: next.out,
                    n: first.n,
                    node: first.node,
                };
                launch_of(&chain)
            });
        match merged {
            Some(launch) => {
                // The fused launch takes the later one's place (its inputs are ready there);
                // the earlier one goes. The new chain may fuse again with what follows.
                launches[j] = launch;
                launches.remove(i);
            }
            None => i += 1,
        }
    }
    lowered.launches = launches;
    recompute_lifetimes(lowered);
}

/// Every buffer's first and last launch from the launches; inputs live from the start,
/// outputs to the end, and a buffer nothing uses any more takes no memory.
fn recompute_lifetimes(lowered: &mut Lowered) {
    for b in &mut lowered.buffers {
        *b = BufferUse {
            bytes: b.bytes,
            first: usize::MAX,
            last: 0,
        };
    }
    for (k, launch) in lowered.launches.iter().enumerate() {
        for arg in &launch.args {
            if let Some(Slot::Buffer(b)) = slot(arg) {
                let use_ = &mut lowered.buffers[b];
                use_.first = use_.first.min(k);
                use_.last = use_.last.max(k);
            }
        }
    }
    for (s, _) in &lowered.inputs {
        if let Slot::Buffer(b) = *s {
            lowered.buffers[b].first = 0;
        }
    }
    for (s, _) in &lowered.outputs {
        if let Slot::Buffer(b) = *s {
            let use_ = &mut lowered.buffers[b];
            use_.first = use_.first.min(lowered.launches.len());
            use_.last = usize::MAX;
        }
    }
    for b in &mut lowered.buffers {
        if b.first == usize::MAX {
            *b = BufferUse {
                bytes: 0,
                first: 0,
                last: 0,
            };
        }
    }
}
