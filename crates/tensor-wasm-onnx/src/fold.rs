//! Constant folding: a node whose inputs are all constants is computed once, when the model
//! is loaded, by the same kernels on the CPU backend (whose bits the GPU's equal), and its
//! outputs become constants.

use crate::graph::{ConstData, Constant, Graph, Source};
use crate::launcher::BackendLauncher;
use crate::lower::Lower;
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
    if !folded.is_empty() {
        let mut index = 0;
        let mut new_index = vec![usize::MAX; graph.nodes.len()];
        for (i, slot) in new_index.iter_mut().enumerate() {
            if !folded.contains(&i) {
                *slot = index;
                index += 1;
            }
        }
        let mut i = 0;
        graph.nodes.retain(|_| {
            let keep = !folded.contains(&i);
            i += 1;
            keep
        });
        for value in &mut graph.values {
            if let Source::Node(n) = &mut value.source {
                *n = new_index[*n];
            }
        }
    }
    Ok(folded.len())
}
