//! What the pipeline-executor tests share: host round trips on one stream,
//! the data source (inputs in, loss `0.5·||y||²` out), and the unpipelined
//! float64 reference of a chain of `[rows, h] × [h, h]` GEMM stages.

use ferrotron::parallel::pipeline::PipelineData;
use ferrotron::{DeviceBuffer, Result, Stream};

use super::ranks::{mm, mm_at, mm_bt};

/// Downloads through `stream` only (`to_host` would wait for the whole
/// device, sends in flight included).
pub fn down(stream: &Stream, b: &DeviceBuffer<f32>) -> Result<Vec<f64>> {
    let mut h = vec![0.0f32; b.len()];
    stream.copy_to_host(b, &mut h)?;
    Ok(h.iter().map(|&v| v as f64).collect())
}

pub fn up(stream: &Stream, v: &[f64], out: &mut DeviceBuffer<f32>) -> Result<()> {
    let h: Vec<f32> = v.iter().map(|&x| x as f32).collect();
    stream.copy_from_host(&h, out)?;
    stream.synchronize()
}

/// Micro-batch inputs for the first stage; the last stage's loss
/// `0.5·||y||²` per micro-batch, whose gradient is `y`.
pub struct Data<'a> {
    pub xs: &'a [Vec<f32>],
    pub losses: Vec<Option<f64>>,
}

impl<'a> Data<'a> {
    pub fn new(xs: &'a [Vec<f32>]) -> Self {
        Data {
            xs,
            losses: vec![None; xs.len()],
        }
    }
}

impl PipelineData<f32> for Data<'_> {
    fn input(&mut self, stream: &Stream, mb: usize) -> Result<DeviceBuffer<f32>> {
        let mut b = stream.device().alloc_zeros(self.xs[mb].len())?;
        stream.copy_from_host(&self.xs[mb], &mut b)?;
        stream.synchronize()?;
        Ok(b)
    }

    fn input_len(&self, mb: usize) -> Option<usize> {
        self.xs.get(mb).map(Vec::len)
    }

    fn loss_grad(
        &mut self,
        stream: &Stream,
        mb: usize,
        output: &DeviceBuffer<f32>,
    ) -> Result<DeviceBuffer<f32>> {
        let y = down(stream, output)?;
        self.losses[mb] = Some(0.5 * y.iter().map(|v| v * v).sum::<f64>());
        let mut g = stream.device().alloc_zeros(y.len())?;
        up(stream, &y, &mut g)?;
        Ok(g)
    }
}

/// Unpipelined float64 run of the stages `w` (each `[h, h]`) over the
/// micro-batches `xs` (each `[rows, h]`): losses per micro-batch and the
/// summed weight gradient per stage.
pub fn reference(
    w: &[Vec<f64>],
    xs: &[Vec<f32>],
    rows: usize,
    h: usize,
) -> (Vec<f64>, Vec<Vec<f64>>) {
    let mut grads = vec![vec![0.0; h * h]; w.len()];
    let mut losses = Vec::new();
    for x in xs {
        let mut acts = vec![x.iter().map(|&v| v as f64).collect::<Vec<f64>>()];
        for ws in w {
            let y = mm(acts.last().unwrap(), ws, rows, h, h);
            acts.push(y);
        }
        let y = acts.last().unwrap();
        losses.push(0.5 * y.iter().map(|v| v * v).sum::<f64>());
        let mut dy = y.clone();
        for st in (0..w.len()).rev() {
            let dw = mm_at(&acts[st], &dy, h, h, rows);
            for (g, d) in grads[st].iter_mut().zip(dw) {
                *g += d;
            }
            dy = mm_bt(&dy, &w[st], rows, h, h);
        }
    }
    (losses, grads)
}

/// The last pipeline rank's per-micro-batch losses against `reference`
/// (f32 tolerance); every micro-batch must have one.
pub fn assert_losses(what: &str, seed: u64, losses: &[Option<f64>], reference: &[f64]) {
    let l: Vec<f64> = losses
        .iter()
        .map(|l| l.unwrap_or_else(|| panic!("{what}: a micro-batch without loss")))
        .collect();
    super::assert_close(
        &format!("{what}: losses"),
        ferrotron::DType::F32,
        seed,
        &l,
        reference,
    );
}
