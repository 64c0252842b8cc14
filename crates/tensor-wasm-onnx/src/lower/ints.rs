//! Shape arithmetic: `Shape` and the ops that pass its int64 values on (`Slice`, `Concat`,
//! `Gather`, `Squeeze`, `Unsqueeze`, `Identity`) are computed when planning, since every
//! shape is known then; their values feed `Reshape` and the other ops that take shapes and
//! axes. Nothing is launched for them.

use super::{axis_of, squeeze_dims, unsqueeze_dims, Lower};
use crate::graph::{ConstData, Constant, GraphNode};
use crate::ops::Op;
use crate::{OnnxError, Result};

impl Lower<'_> {
    /// The int64 value at input `i` (a constant, or one computed when planning).
    fn int_value(&self, node: &GraphNode, i: usize) -> Result<Constant> {
        let value = node
            .inputs
            .get(i)
            .copied()
            .flatten()
            .ok_or_else(|| OnnxError::invalid_graph(format!("input {i} is required")))?;
        match self.graph.constant(value).or(self.known[value].as_ref()) {
            Some(
                c @ Constant {
                    data: ConstData::I64(_),
                    ..
                },
            ) => Ok(c.clone()),
            _ => Err(OnnxError::unsupported(format!(
                "input {i} must be int64 known when planning"
            ))),
        }
    }

    pub(super) fn lower_ints(&mut self, node: &GraphNode) -> Result<()> {
        let [output] = node.outputs.as_slice() else {
            return Err(OnnxError::invalid_graph("exactly one output is supported"));
        };
        let values = |c: &Constant| match &c.data {
            ConstData::I64(v) => v.clone(),
            ConstData::F32(_) => Vec::new(),
        };
        let result = match &node.op {
            Op::Shape { start, end } => {
                let value = node.inputs[0].expect("Shape has an input");
                let dims = self.shape(value)?.to_vec();
                let rank = dims.len() as i64;
                let clamp = |v: i64| (if v < 0 { v + rank } else { v }).clamp(0, rank) as usize;
                let (a, b) = (clamp(*start), clamp(end.unwrap_or(rank)));
                let v: Vec<i64> = dims[a..b.max(a)].iter().map(|&d| d as i64).collect();
                Constant {
                    dims: vec![v.len()],
                    data: ConstData::I64(v),
                }
            }
            Op::Identity => self.int_value(node, 0)?,
            Op::Squeeze => {
                let c = self.int_value(node, 0)?;
                let dims = squeeze_dims(&c.dims, self.ints(node, 1)?)?;
                Constant { dims, ..c }
            }
            Op::Unsqueeze => {
                let c = self.int_value(node, 0)?;
                let dims = unsqueeze_dims(&c.dims, &self.ints(node, 1)?.unwrap_or_default())?;
                Constant { dims, ..c }
            }
            Op::Concat { axis } => {
                let mut v = Vec::new();
                for i in 0..node.inputs.len() {
                    let c = self.int_value(node, i)?;
                    if c.dims.len() != 1 {
                        return Err(OnnxError::unsupported(
                            "Concat of int64 values of rank other than 1",
                        ));
                    }
                    v.extend(values(&c));
                }
                axis_of(*axis, 1, "Concat")?;
                Constant {
                    dims: vec![v.len()],
                    data: ConstData::I64(v),
                }
            }
            Op::Slice => {
                let c = self.int_value(node, 0)?;
                if c.dims.len() != 1 {
                    return Err(OnnxError::unsupported(
                        "Slice of int64 values of rank other than 1",
                    ));
                }
                let data = values(&c);
                let one = |i: usize| -> Result<Option<i64>> {
                    Ok(match self.ints(node, i)? {
                        Some(v) if v.len() == 1 => Some(v[0]),
                        Some(v) if v.is_empty() => None,
                        Some(_) => {
                            return Err(OnnxError::unsupported("Slice over more than one axis"))
                        }
                        None => None,
                    })
                };
                let (start, end) = (one(1)?.unwrap_or(0), one(2)?.unwrap_or(i64::MAX));
                if one(3)?.is_some_and(|a| a != 0 && a != -1) {
                    return Err(OnnxError::invalid_graph("Slice axis of a rank-1 value"));
                }
                if one(4)?.is_some_and(|s| s != 1) {
                    return Err(OnnxError::unsupported("Slice with a step other than 1"));
                }
                let len = data.len() as i64;
                let clamp = |v: i64| (if v < 0 { v + len } else { v }).clamp(0, len) as usize;
                let (a, b) = (clamp(start), clamp(end));
                let v = data[a..b.max(a)].to_vec();
                Constant {
                    dims: vec![v.len()],
                    data: ConstData::I64(v),
                }
            }
            Op::Gather => {
                let c = self.int_value(node, 0)?;
                let indices = self.int_value(node, 1)?;
                if c.dims.len() != 1 {
                    return Err(OnnxError::unsupported(
                        "Gather of int64 values of rank other than 1",
                    ));
                }
                let data = values(&c);
                let len = data.len() as i64;
                let v = values(&indices)
                    .iter()
                    .map(|&k| {
                        let k = if k < 0 { k + len } else { k };
                        data.get(k as usize).copied().ok_or_else(|| {
                            OnnxError::invalid_graph(format!("index {k} outside {len} values"))
                        })
                    })
                    .collect::<Result<Vec<i64>>>()?;
                Constant {
                    dims: indices.dims.clone(),
                    data: ConstData::I64(v),
                }
            }
            other => {
                return Err(OnnxError::unsupported(format!(
                    "{other:?} of int64 values when planning"
                )))
            }
        };
        self.shapes[*output] = Some(result.dims.clone());
        self.known[*output] = Some(result);
        Ok(())
    }
}
