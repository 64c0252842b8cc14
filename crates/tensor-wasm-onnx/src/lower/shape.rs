//! Lowering of the operators that move data: Transpose, Concat, Gather, the reductions, and
//! the shape arithmetic of Reshape.

use super::{axis_of, elements, u32_of, Lower, Slot};
use crate::graph::{ConstData, Constant, GraphNode};
use crate::ops::ReduceKind;
use crate::{OnnxError, Result};

impl Lower<'_> {
    /// `x` of `dims` with its axes in `perm` order: the output slot (the input's own when no
    /// element moves) and the output dimensions.
    pub(super) fn permute(
        &mut self,
        x: Slot,
        dims: &[usize],
        perm: &[usize],
    ) -> Result<(Slot, Vec<usize>)> {
        let out_dims: Vec<usize> = perm.iter().map(|&a| dims[a]).collect();
        let (cd, cp) = canonical_permute(dims, perm);
        if cp.iter().enumerate().all(|(i, &a)| i == a) {
            return Ok((x, out_dims));
        }
        if cp.len() > 4 {
            return Err(OnnxError::unsupported(format!(
                "a transpose of {dims:?} by {perm:?} moves {} axes (at most 4)",
                cp.len()
            )));
        }
        let out = self.output(&out_dims)?;
        let descriptor = format!(
            "permute[{}]",
            cp.iter().map(|a| a.to_string()).collect::<String>()
        );
        let sizes = cd
            .iter()
            .map(|&v| u32_of(v, "permute size"))
            .collect::<Result<Vec<_>>>()?;
        self.launch(&descriptor, &[x, out], &sizes, &[])?;
        Ok((out, out_dims))
    }

    pub(super) fn transpose(&mut self, node: &GraphNode, perm: Option<&[i64]>) -> Result<()> {
        let (x, dx) = self.input(node, 0)?;
        let rank = dx.len();
        let perm: Vec<usize> = match perm {
            Some(p) => p
                .iter()
                .map(|&a| axis_of(a, rank, "Transpose"))
                .collect::<Result<_>>()?,
            None => (0..rank).rev().collect(),
        };
        let mut seen = perm.clone();
        seen.sort_unstable();
        if seen != (0..rank).collect::<Vec<_>>() {
            return Err(OnnxError::invalid_graph(format!(
                "perm {perm:?} is not a permutation of {rank} axes"
            )));
        }
        let (out, dims) = self.permute(x, &dx, &perm)?;
        self.result(node, out, dims)
    }

    pub(super) fn concat(&mut self, node: &GraphNode, axis: i64) -> Result<()> {
        let parts = (0..node.inputs.len())
            .map(|i| self.input(node, i))
            .collect::<Result<Vec<_>>>()?;
        let Some((_, first)) = parts.first() else {
            return Err(OnnxError::invalid_graph("Concat of nothing"));
        };
        let rank = first.len();
        let a = axis_of(axis, rank, "Concat")?;
        for (_, d) in &parts {
            if d.len() != rank || (0..rank).any(|i| i != a && d[i] != first[i]) {
                return Err(OnnxError::invalid_graph(format!(
                    "Concat of {first:?} and {d:?} along axis {a}"
                )));
            }
        }
        let outer = elements(&first[..a]).unwrap_or(usize::MAX);
        let inner = elements(&first[a + 1..]).unwrap_or(usize::MAX);
        // Joined four at a time: the first launch's output is the next one's first input.
        let mut acc: Option<(Slot, usize)> = None;
        let mut rest = parts.iter().map(|(s, d)| (*s, d[a])).peekable();
        while rest.peek().is_some() {
            let mut group: Vec<(Slot, usize)> = acc.into_iter().collect();
            while group.len() < 4 {
                match rest.next() {
                    Some(p) => group.push(p),
                    None => break,
                }
            }
            let along: usize = group.iter().map(|&(_, n)| n).sum();
            let mut dims = first.clone();
            dims[a] = along;
            if group.len() == 1 {
                acc = Some(group[0]);
                continue;
            }
            let out = self.output(&dims)?;
            if outer * along * inner > 0 {
                let mut tensors: Vec<Slot> = group.iter().map(|&(s, _)| s).collect();
                tensors.push(out);
                let mut sizes = vec![u32_of(outer, "outer")?];
                for &(_, n) in &group {
                    sizes.push(u32_of(n, "concat size")?);
                }
                sizes.push(u32_of(inner, "inner")?);
                self.launch(&format!("concat[{}]", group.len()), &tensors, &sizes, &[])?;
            }
            acc = Some((out, along));
        }
        let (slot, along) = acc.expect("at least one part");
        let mut dims = first.clone();
        dims[a] = along;
        self.result(node, slot, dims)
    }

    pub(super) fn gather(&mut self, node: &GraphNode) -> Result<()> {
        let (table, dt) = self.input(node, 0)?;
        let Some((&rows, rest)) = dt.split_first() else {
            return Err(OnnxError::invalid_graph("Gather from a scalar"));
        };
        let index_value = node.inputs[1].expect("required");
        let (indices, di) = match self.graph.constant(index_value) {
            Some(Constant {
                data: ConstData::I64(v),
                dims,
            }) => {
                let bytes = index_bytes(v, Some(rows))?;
                (self.constant(bytes), dims.clone())
            }
            _ => self.input(node, 1)?,
        };
        let cols = elements(rest).unwrap_or(usize::MAX);
        let count = elements(&di).unwrap_or(usize::MAX);
        let dims = [di.as_slice(), rest].concat();
        let out = self.output(&dims)?;
        if count * cols > 0 {
            self.launch(
                "gather[rows]",
                &[table, indices, out],
                &[
                    u32_of(rows, "rows")?,
                    u32_of(cols, "cols")?,
                    u32_of(count, "indices")?,
                ],
                &[],
            )?;
        }
        self.result(node, out, dims)
    }

    pub(super) fn reduce(
        &mut self,
        node: &GraphNode,
        kind: ReduceKind,
        keep_dims: bool,
        noop_with_empty_axes: bool,
    ) -> Result<()> {
        let (x, dx) = self.input(node, 0)?;
        let rank = dx.len();
        let axes = self.ints(node, 1)?.unwrap_or_default();
        if axes.is_empty() && noop_with_empty_axes {
            return self.result(node, x, dx);
        }
        let mut axes: Vec<usize> = if axes.is_empty() {
            (0..rank).collect()
        } else {
            axes.iter()
                .map(|&a| axis_of(a, rank, "Reduce"))
                .collect::<Result<_>>()?
        };
        axes.sort_unstable();
        axes.dedup();
        let kept: Vec<usize> = (0..rank).filter(|a| !axes.contains(a)).collect();
        let perm: Vec<usize> = kept.iter().chain(&axes).copied().collect();
        let (moved, _) = self.permute(x, &dx, &perm)?;
        let rows = kept.iter().map(|&a| dx[a]).product::<usize>();
        let cols = axes.iter().map(|&a| dx[a]).product::<usize>();
        let dims: Vec<usize> = (0..rank)
            .filter_map(|a| {
                if !axes.contains(&a) {
                    Some(dx[a])
                } else if keep_dims {
                    Some(1)
                } else {
                    None
                }
            })
            .collect();
        let out = self.output(&dims)?;
        if rows > 0 {
            if cols == 0 {
                let zeros = self.fill(0.0, rows);
                self.launch(
                    "elementwise[scale]",
                    &[zeros, out],
                    &[u32_of(rows, "rows")?],
                    &[1.0],
                )?;
            } else {
                self.sum_rows(moved, out, rows, cols)?;
                if kind == ReduceKind::Mean {
                    self.divide_rows(out, rows, cols)?;
                }
            }
        }
        self.result(node, out, dims)
    }
}

/// A permutation with unit axes dropped and axes that stay neighbours merged: the input
/// dimensions and the permutation of the same copy with the fewest axes.
pub(super) fn canonical_permute(dims: &[usize], perm: &[usize]) -> (Vec<usize>, Vec<usize>) {
    // Unit axes move no data.
    let kept: Vec<usize> = (0..dims.len()).filter(|&a| dims[a] != 1).collect();
    let renumber = |a: usize| kept.iter().position(|&k| k == a);
    let perm: Vec<usize> = perm.iter().filter_map(|&a| renumber(a)).collect();
    let dims: Vec<usize> = kept.iter().map(|&a| dims[a]).collect();
    // Merge output neighbours that are input neighbours in the same order.
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for &a in &perm {
        match groups.last_mut() {
            Some(g) if *g.last().expect("non-empty") + 1 == a => g.push(a),
            _ => groups.push(vec![a]),
        }
    }
    let mut order: Vec<usize> = (0..groups.len()).collect();
    order.sort_by_key(|&g| groups[g][0]);
    let merged_dims: Vec<usize> = order
        .iter()
        .map(|&g| groups[g].iter().map(|&a| dims[a]).product())
        .collect();
    let merged_perm: Vec<usize> = (0..groups.len())
        .map(|g| order.iter().position(|&o| o == g).expect("every group"))
        .collect();
    (merged_dims, merged_perm)
}

/// int64 indices as i32 bytes; with `rows`, each must be inside `-rows..rows` (ONNX makes an
/// out-of-range constant index an error).
pub(super) fn index_bytes(values: &[i64], rows: Option<usize>) -> Result<Vec<u8>> {
    let mut bytes = Vec::with_capacity(values.len() * 4);
    for &v in values {
        if let Some(rows) = rows {
            let r = rows as i64;
            if !(-r..r).contains(&v) {
                return Err(OnnxError::invalid_graph(format!(
                    "index {v} is outside {rows} rows"
                )));
            }
        }
        let v = i32::try_from(v)
            .map_err(|_| OnnxError::unsupported(format!("index {v} does not fit in int32")))?;
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    Ok(bytes)
}

/// Reshape's output dimensions: `0` copies the input's (unless `allow_zero`), one `-1` is
/// inferred.
pub(super) fn reshape(dims: &[usize], spec: &[i64], allow_zero: bool) -> Result<Vec<usize>> {
    let total = elements(dims).unwrap_or(usize::MAX);
    let mut out = Vec::with_capacity(spec.len().min(8));
    let mut infer = None;
    for (i, &v) in spec.iter().enumerate() {
        match v {
            -1 if infer.is_none() => {
                infer = Some(i);
                out.push(1);
            }
            0 if !allow_zero => out.push(*dims.get(i).ok_or_else(|| {
                OnnxError::invalid_graph(format!("Reshape: 0 at {i} past the input's rank"))
            })?),
            v if v >= 0 => out.push(v as usize),
            _ => return Err(OnnxError::invalid_graph(format!("Reshape to {spec:?}"))),
        }
    }
    let known = elements(&out).unwrap_or(usize::MAX);
    if let Some(i) = infer {
        if known == 0 || !total.is_multiple_of(known) {
            return Err(OnnxError::invalid_graph(format!(
                "Reshape of {dims:?} to {spec:?}"
            )));
        }
        out[i] = total / known;
    } else if known != total {
        return Err(OnnxError::invalid_graph(format!(
            "Reshape of {dims:?} to {spec:?}: element counts differ"
        )));
    }
    Ok(out)
}
