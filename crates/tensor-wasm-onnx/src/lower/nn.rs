//! Lowering of the neural-network operators: MatMul, Gemm, Conv, pooling, LayerNormalization.

use super::{axis_of, broadcast, elements, u32_of, Lower, Slot};
use crate::graph::{ConstData, Constant, GraphNode};
use crate::ops::Window;
use crate::{OnnxError, Result};

impl Lower<'_> {
    pub(super) fn matmul(&mut self, node: &GraphNode) -> Result<()> {
        let (a, mut da) = self.input(node, 0)?;
        let (b, mut db) = self.input(node, 1)?;
        let (vector_a, vector_b) = (da.len() == 1, db.len() == 1);
        if da.is_empty() || db.is_empty() {
            return Err(OnnxError::invalid_graph("MatMul of a scalar"));
        }
        if vector_a {
            da.insert(0, 1);
        }
        if vector_b {
            db.push(1);
        }
        let (m, k) = (da[da.len() - 2], da[da.len() - 1]);
        let (k2, n) = (db[db.len() - 2], db[db.len() - 1]);
        if k != k2 {
            return Err(OnnxError::invalid_graph(format!(
                "MatMul of {da:?} by {db:?}: inner dimensions differ"
            )));
        }
        let (batch_a, batch_b) = (&da[..da.len() - 2], &db[..db.len() - 2]);
        let batch = broadcast(batch_a, batch_b, "MatMul batch")?;
        let mut dims = batch.clone();
        if !vector_a {
            dims.push(m);
        }
        if !vector_b {
            dims.push(n);
        }
        let out = self.output(&dims)?;
        let count = elements(&batch).unwrap_or(usize::MAX);
        if elements(&dims) == Some(0) {
            return self.result(node, out, dims);
        }
        if elements(batch_b) == Some(1) {
            // One right-hand matrix: the left's batches are rows of one product.
            let rows = count.saturating_mul(m);
            let a = self.expand(a, &da, &[batch.as_slice(), &[m, k]].concat())?;
            self.launch(
                "matmul[16x16x16]",
                &[a, b, out],
                &[u32_of(rows, "m")?, u32_of(n, "n")?, u32_of(k, "k")?],
                &[],
            )?;
        } else {
            let a = self.expand(a, &da, &[batch.as_slice(), &[m, k]].concat())?;
            let b = self.expand(b, &db, &[batch.as_slice(), &[k, n]].concat())?;
            self.launch(
                "bmm[nn]",
                &[a, b, out],
                &[
                    u32_of(count, "batch")?,
                    u32_of(m, "m")?,
                    u32_of(n, "n")?,
                    u32_of(k, "k")?,
                ],
                &[],
            )?;
        }
        self.result(node, out, dims)
    }

    pub(super) fn gemm(
        &mut self,
        node: &GraphNode,
        alpha: f32,
        beta: f32,
        trans_a: bool,
        trans_b: bool,
    ) -> Result<()> {
        let (a, da) = self.input(node, 0)?;
        let (b, db) = self.input(node, 1)?;
        let (&[ra, ca], &[rb, cb]) = (da.as_slice(), db.as_slice()) else {
            return Err(OnnxError::invalid_graph("Gemm takes two matrices"));
        };
        let (m, k) = if trans_a { (ca, ra) } else { (ra, ca) };
        let (k2, n) = if trans_b { (cb, rb) } else { (rb, cb) };
        if k != k2 {
            return Err(OnnxError::invalid_graph(format!(
                "Gemm of {da:?} by {db:?}: inner dimensions differ"
            )));
        }
        let dims = vec![m, n];
        let out = self.output(&dims)?;
        if m * n == 0 {
            return self.result(node, out, dims);
        }
        // Constant weights stored transposed (a dense layer's usual form) are transposed now,
        // once per plan: the same products in the same order, without a transposing copy on
        // every run.
        let (b, trans_b) = match b {
            Slot::Const(c) if trans_b => match self.const_bytes(c) {
                Some(bytes) => {
                    let mut t = vec![0u8; bytes.len()];
                    for (j, row) in bytes.chunks_exact(4 * k).enumerate() {
                        for (p, value) in row.chunks_exact(4).enumerate() {
                            t[4 * (p * n + j)..][..4].copy_from_slice(value);
                        }
                    }
                    (self.constant(t), false)
                }
                None => (b, trans_b),
            },
            _ => (b, trans_b),
        };
        let layout = format!(
            "bmm[{}{}]",
            if trans_a { 't' } else { 'n' },
            if trans_b { 't' } else { 'n' }
        );
        let sizes = [1, u32_of(m, "m")?, u32_of(n, "n")?, u32_of(k, "k")?];
        self.launch(&layout, &[a, b, out], &sizes, &[])?;
        let mn = u32_of(m * n, "elements")?;
        if alpha != 1.0 {
            self.launch("elementwise[scale]", &[out, out], &[mn], &[alpha])?;
        }
        if let Some((c, dc)) = self.optional(node, 2)? {
            if beta != 0.0 {
                let mut c = self.expand(c, &dc, &dims)?;
                if beta != 1.0 {
                    let scaled = self.output(&dims)?;
                    self.launch("elementwise[scale]", &[c, scaled], &[mn], &[beta])?;
                    c = scaled;
                }
                self.launch("elementwise[add]", &[out, c, out], &[mn], &[])?;
            }
        }
        self.result(node, out, dims)
    }

    pub(super) fn conv(&mut self, node: &GraphNode, window: Window, group: usize) -> Result<()> {
        let (x, dx) = self.input(node, 0)?;
        let (w, dw) = self.input(node, 1)?;
        let (&[n, c, h, wd], &[k, c2, r, s]) = (dx.as_slice(), dw.as_slice()) else {
            return Err(OnnxError::unsupported(format!(
                "Conv of {dx:?} by {dw:?} (2-D convolutions only)"
            )));
        };
        // One group, or depthwise: one group per channel, one filter each.
        let depthwise = group != 1;
        if depthwise && !(group == c && k == c && c2 == 1) {
            return Err(OnnxError::unsupported(format!(
                "Conv with group = {group} over {c} channels and {k} filters (one group, or \
                 depthwise: group = channels = filters)"
            )));
        }
        if !depthwise && c != c2 {
            return Err(OnnxError::invalid_graph(format!(
                "Conv: input has {c} channels, weights {c2}"
            )));
        }
        if window.kernel.is_some_and(|ks| ks != [r, s]) {
            return Err(OnnxError::invalid_graph(
                "Conv: kernel_shape differs from the weights",
            ));
        }
        let (p, q) = window_output(h, wd, r, s, window);
        let dims = vec![n, k, p, q];
        let out = self.output(&dims)?;
        if elements(&dims) == Some(0) {
            return self.result(node, out, dims);
        }
        let (kind, sizes) = if depthwise {
            ("dwconv2d", vec![n, c, h, wd])
        } else {
            ("conv2d", vec![n, c, h, wd, k])
        };
        let descriptor = format!("{kind}[{r}x{s},s{},p{}]", window.stride, window.pad);
        let sizes = sizes
            .iter()
            .map(|&v| u32_of(v, "Conv size"))
            .collect::<Result<Vec<_>>>()?;
        self.launch(&descriptor, &[x, w, out], &sizes, &[])?;
        if let Some((bias, db)) = self.optional(node, 2)? {
            if db != [k] {
                return Err(OnnxError::invalid_graph(format!(
                    "Conv bias of shape {db:?} for {k} output channels"
                )));
            }
            let bias = self.expand(bias, &[1, k, 1, 1], &dims)?;
            let total = u32_of(n * k * p * q, "elements")?;
            self.launch("elementwise[add]", &[out, bias, out], &[total], &[])?;
        }
        self.result(node, out, dims)
    }

    pub(super) fn pool(&mut self, node: &GraphNode, kind: &str, window: Window) -> Result<()> {
        let (x, dx) = self.input(node, 0)?;
        let &[n, c, h, w] = dx.as_slice() else {
            return Err(OnnxError::unsupported(format!(
                "pooling of {dx:?} (2-D pooling only)"
            )));
        };
        let [r, s] = window.kernel.expect("pooling windows have a kernel");
        let (p, q) = window_output(h, w, r, s, window);
        let dims = vec![n, c, p, q];
        let out = self.output(&dims)?;
        if elements(&dims) != Some(0) {
            let descriptor = format!("{kind}[{r}x{s},s{},p{}]", window.stride, window.pad);
            let sizes = [n, c, h, w]
                .iter()
                .map(|&v| u32_of(v, "pool size"))
                .collect::<Result<Vec<_>>>()?;
            self.launch(&descriptor, &[x, out], &sizes, &[])?;
        }
        self.result(node, out, dims)
    }

    pub(super) fn global_average(&mut self, node: &GraphNode) -> Result<()> {
        let (x, dx) = self.input(node, 0)?;
        let &[n, c, h, w] = dx.as_slice() else {
            return Err(OnnxError::unsupported(
                "GlobalAveragePool of a non-4-D tensor",
            ));
        };
        let dims = vec![n, c, 1, 1];
        let out = self.output(&dims)?;
        if n * c * h * w == 0 {
            return self.result(node, out, dims);
        }
        if (1..=11).contains(&h) && (1..=11).contains(&w) {
            // One window over the whole image: avgpool's in-order sum, then one division.
            let descriptor = format!("avgpool[{h}x{w},s1,p0]");
            let sizes = [n, c, h, w]
                .iter()
                .map(|&v| u32_of(v, "pool size"))
                .collect::<Result<Vec<_>>>()?;
            self.launch(&descriptor, &[x, out], &sizes, &[])?;
        } else {
            self.sum_rows(x, out, n * c, h * w)?;
            self.divide_rows(out, n * c, h * w)?;
        }
        self.result(node, out, dims)
    }

    /// `out[i] = Σ x[i][..]` over `rows × cols`.
    pub(super) fn sum_rows(&mut self, x: Slot, out: Slot, rows: usize, cols: usize) -> Result<()> {
        self.launch(
            "reduce[sum]",
            &[x, out],
            &[u32_of(rows, "rows")?, u32_of(cols, "cols")?],
            &[],
        )
    }

    /// `out[i] /= cols` (one `div.rn` each).
    pub(super) fn divide_rows(&mut self, out: Slot, rows: usize, cols: usize) -> Result<()> {
        let divisor = self.fill(cols as f32, rows);
        self.launch(
            "elementwise[div]",
            &[out, divisor, out],
            &[u32_of(rows, "rows")?],
            &[],
        )
    }

    pub(super) fn layernorm(&mut self, node: &GraphNode, axis: i64, epsilon: f32) -> Result<()> {
        let (x, dx) = self.input(node, 0)?;
        let a = axis_of(axis, dx.len(), "LayerNormalization")?;
        let rows = elements(&dx[..a]).unwrap_or(usize::MAX);
        let cols = elements(&dx[a..]).unwrap_or(usize::MAX);
        let tail = dx[a..].to_vec();
        let (scale, ds) = self.input(node, 1)?;
        let scale = self.expand(scale, &ds, &tail)?;
        let bias = match self.optional(node, 2)? {
            Some((bias, db)) => self.expand(bias, &db, &tail)?,
            None => self.fill(0.0, cols),
        };
        let out = self.output(&dx)?;
        if rows * cols > 0 {
            self.launch(
                "layernorm[rows]",
                &[x, scale, bias, out],
                &[u32_of(rows, "rows")?, u32_of(cols, "cols")?],
                &[epsilon],
            )?;
        }
        self.result(node, out, dx)
    }
    /// The f32 constant at input `i`.
    fn f32_constant(&self, node: &GraphNode, i: usize, what: &str) -> Result<Vec<f32>> {
        let value =
            node.inputs.get(i).copied().flatten().ok_or_else(|| {
                OnnxError::invalid_graph(format!("{what} (input {i}) is required"))
            })?;
        match self.graph.constant(value) {
            Some(Constant {
                data: ConstData::F32(v),
                ..
            }) => Ok(v.clone()),
            _ => Err(OnnxError::unsupported(format!(
                "{what} (input {i}) must be a float32 constant"
            ))),
        }
    }

    /// BatchNormalization not folded into a Conv: `x · a + b` per channel, with
    /// `a = scale / sqrt(var + ε)` and `b = B − mean · a` computed here (once, on the host,
    /// so every backend gets the same constants), broadcast over the channel axis.
    pub(super) fn batchnorm(&mut self, node: &GraphNode, epsilon: f32) -> Result<()> {
        let (x, dx) = self.input(node, 0)?;
        let (a, b) = batchnorm_affine(
            &self.f32_constant(node, 1, "scale")?,
            &self.f32_constant(node, 2, "B")?,
            &self.f32_constant(node, 3, "mean")?,
            &self.f32_constant(node, 4, "var")?,
            epsilon,
        )?;
        let c = dx.get(1).copied().unwrap_or(0);
        if dx.len() < 2 || a.len() != c {
            return Err(OnnxError::invalid_graph(format!(
                "BatchNormalization of {dx:?} with {} channels of parameters",
                a.len()
            )));
        }
        let mut per_channel = vec![1usize; dx.len()];
        per_channel[1] = c;
        let bytes = |v: &[f32]| v.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>();
        let a = self.constant(bytes(&a));
        let b = self.constant(bytes(&b));
        let a = self.expand(a, &per_channel, &dx)?;
        let b = self.expand(b, &per_channel, &dx)?;
        let out = self.output(&dx)?;
        let n = u32_of(elements(&dx).unwrap_or(0), "elements")?;
        if n > 0 {
            self.launch("elementwise[mul]", &[x, a, out], &[n], &[])?;
            self.launch("elementwise[add]", &[out, b, out], &[n], &[])?;
        }
        self.result(node, out, dx)
    }

    /// `max(0, min(1, α·x + β))` into a new buffer: `scale`, then `add β`, `relu` and
    /// `min 1` in place (which fusion joins into one chain).
    pub(super) fn hard_sigmoid(
        &mut self,
        x: Slot,
        dims: &[usize],
        alpha: f32,
        beta: f32,
    ) -> Result<Slot> {
        let out = self.output(dims)?;
        let count = elements(dims).unwrap_or(0);
        let n = u32_of(count, "elements")?;
        if n > 0 {
            let beta = self.fill(beta, count);
            let one = self.fill(1.0, count);
            self.launch("elementwise[scale]", &[x, out], &[n], &[alpha])?;
            self.launch("elementwise[add]", &[out, beta, out], &[n], &[])?;
            self.launch("elementwise[relu]", &[out, out], &[n], &[])?;
            self.launch("elementwise[min]", &[out, one, out], &[n], &[])?;
        }
        Ok(out)
    }
}

/// Output height and width of a 2-D window (floor mode), as conv2d computes them.
fn window_output(h: usize, w: usize, r: usize, s: usize, window: Window) -> (usize, usize) {
    let side = |input: usize, filter: usize| {
        let padded = input + 2 * window.pad;
        if padded < filter {
            0
        } else {
            (padded - filter) / window.stride + 1
        }
    };
    (side(h, r), side(w, s))
}

/// BatchNormalization's per-channel affine map: `a = scale / sqrt(var + ε)`,
/// `b = B − mean · a`, each operation one f32 rounding.
pub(crate) fn batchnorm_affine(
    scale: &[f32],
    bias: &[f32],
    mean: &[f32],
    var: &[f32],
    epsilon: f32,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let c = scale.len();
    if bias.len() != c || mean.len() != c || var.len() != c {
        return Err(OnnxError::invalid_graph(
            "BatchNormalization parameters of different lengths",
        ));
    }
    let a: Vec<f32> = (0..c)
        .map(|i| scale[i] / (var[i] + epsilon).sqrt())
        .collect();
    let b: Vec<f32> = (0..c).map(|i| bias[i] - mean[i] * a[i]).collect();
    Ok((a, b))
}
