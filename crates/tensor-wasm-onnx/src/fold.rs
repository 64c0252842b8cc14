//! Constant folding: a node whose inputs are all constants is computed once, when the model
//! is loaded, by the same kernels on the CPU backend (whose bits the GPU's equal), and its
//! outputs become constants.

use crate::graph::{ConstData, Constant, Graph, Source, Value, ValueId};
use crate::launcher::BackendLauncher;
use crate::lower::batchnorm_affine;
use crate::lower::Lower;
use crate::ops::Op;
use crate::plan::Plan;
use crate::Result;

/// Folds every node of `graph` whose inputs are all constants; `max_bytes` bounds the memory
/// of one folded node. Returns how many nodes were folded.
pub fn fold(graph: &mut Graph, max_bytes: usize) -> Result<usize> {
    let mut launcher = None;
    let mut folded = Vec::new();
    for i in 0..graph.nodes.len() {
        let node = &graph.nodes[i];
        let all_constant = node
            .inputs
            .iter()
            .flatten()
            .all(|&v| matches!(graph.values[v].source, Source::Constant(_)));
        if !all_constant || node.inputs.iter().flatten().next().is_none() {
            continue;
        }
        // The node alone, as a graph without inputs whose outputs are the node's.
        let single = Graph {
            values: graph.values.clone(),
            nodes: vec![graph.nodes[i].clone()],
            inputs: Vec::new(),
            outputs: graph.nodes[i].outputs.clone(),
        };
        let lowered = Lower::run(&single, &[], None, true)?;
        let plan = Plan::place(&single, lowered, max_bytes)?;
        let mut arena = vec![0u8; plan.arena_bytes];
        plan.write_constants(&single, &mut arena);
        if launcher.is_none() {
            launcher = Some(BackendLauncher::cpu()?);
        }
        plan.run(launcher.as_mut().expect("set above"), &mut arena)?;
        for (&value, placed) in graph.nodes[i].outputs.iter().zip(&plan.outputs) {
            let bytes = &arena[placed.offset..placed.offset + placed.bytes()];
            let data = bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            graph.values[value].source = Source::Constant(Constant {
                dims: placed.dims.clone(),
                data: ConstData::F32(data),
            });
        }
        folded.push(i);
    }
    remove_nodes(graph, &folded);
    Ok(folded.len())
}

/// Removes the nodes at `indices` (sorted) and renumbers the node sources of the values.
fn remove_nodes(graph: &mut Graph, indices: &[usize]) {
    if indices.is_empty() {
        return;
    }
    let mut index = 0;
    let mut new_index = vec![usize::MAX; graph.nodes.len()];
    for (i, slot) in new_index.iter_mut().enumerate() {
        if !indices.contains(&i) {
            *slot = index;
            index += 1;
        }
    }
    let mut i = 0;
    graph.nodes.retain(|_| {
        let keep = !indices.contains(&i);
        i += 1;
        keep
    });
    for value in &mut graph.values {
        if let Source::Node(n) = &mut value.source {
            *n = new_index[*n];
        }
    }
}

/// The float32 constant `value` is, if it is one.
fn f32_constant(graph: &Graph, value: Option<ValueId>) -> Option<(Vec<usize>, Vec<f32>)> {
    match &graph.values[value?].source {
        Source::Constant(Constant {
            dims,
            data: ConstData::F32(v),
        }) => Some((dims.clone(), v.clone())),
        _ => None,
    }
}

/// Folds every BatchNormalization whose input is a Conv's output that nothing else reads into
/// that Conv: weights scaled per output channel by `a = scale / sqrt(var + ε)`, bias
/// `a · bias + (B − mean · a)`, computed once here (so every backend runs the same weights).
/// Returns how many were folded.
pub fn fold_batchnorm(graph: &mut Graph) -> crate::Result<usize> {
    let mut readers = vec![0usize; graph.values.len()];
    for node in &graph.nodes {
        for &v in node.inputs.iter().flatten() {
            readers[v] += 1;
        }
    }
    for &v in &graph.outputs {
        readers[v] += 1;
    }
    let mut removed = Vec::new();
    for b in 0..graph.nodes.len() {
        let Op::BatchNorm { epsilon } = graph.nodes[b].op else {
            continue;
        };
        let Some(x) = graph.nodes[b].inputs.first().copied().flatten() else {
            continue;
        };
        let Source::Node(c) = graph.values[x].source else {
            continue;
        };
        if !matches!(graph.nodes[c].op, Op::Conv { .. }) || readers[x] != 1 {
            continue;
        }
        let params: Option<Vec<Vec<f32>>> = (1..=4)
            .map(|i| {
                f32_constant(graph, graph.nodes[b].inputs.get(i).copied().flatten()).map(|(_, v)| v)
            })
            .collect();
        let Some(params) = params else { continue };
        let Some((w_dims, w)) =
            f32_constant(graph, graph.nodes[c].inputs.get(1).copied().flatten())
        else {
            continue;
        };
        let k = w_dims.first().copied().unwrap_or(0);
        let bias = match graph.nodes[c].inputs.get(2).copied().flatten() {
            Some(v) => match f32_constant(graph, Some(v)) {
                Some((_, bias)) => bias,
                None => continue,
            },
            None => vec![0.0; k],
        };
        let (a, shift) = batchnorm_affine(&params[0], &params[1], &params[2], &params[3], epsilon)?;
        if a.len() != k || bias.len() != k || k == 0 || w.len() % k != 0 {
            continue;
        }
        let per = w.len() / k;
        let folded_w: Vec<f32> = w.iter().enumerate().map(|(i, &v)| v * a[i / per]).collect();
        let folded_b: Vec<f32> = (0..k).map(|i| a[i] * bias[i] + shift[i]).collect();
        let name = graph.values[x].name.clone();
        let mut add = |suffix: &str, dims: Vec<usize>, data: Vec<f32>| {
            graph.values.push(Value {
                name: format!("{name}/batchnorm-{suffix}"),
                source: Source::Constant(Constant {
                    dims,
                    data: ConstData::F32(data),
                }),
            });
            graph.values.len() - 1
        };
        let new_w = add("weight", w_dims, folded_w);
        let new_b = add("bias", vec![k], folded_b);
        let y = graph.nodes[b].outputs[0];
        let conv = &mut graph.nodes[c];
        conv.inputs.truncate(1);
        conv.inputs.push(Some(new_w));
        conv.inputs.push(Some(new_b));
        conv.outputs = vec![y];
        graph.values[y].source = Source::Node(c);
        removed.push(b);
    }
    remove_nodes(graph, &removed);
    Ok(removed.len())
}
