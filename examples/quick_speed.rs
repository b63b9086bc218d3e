use mlx_backend::model::{self, LoadOptions, Logits};
use mlx_backend::{Array, Dtype};
use std::time::Instant;
fn main() {
    let path = std::env::args().nth(1).unwrap();
    for dtype in [None, Some(Dtype::F32)] {
        let m = model::load(
            &path,
            &LoadOptions {
                dtype,
                quantize: None,
            },
        )
        .unwrap()
        .model;
        let mut caches = m.new_caches(256);
        let prompt: Vec<u32> = (0..32).map(|i| 100 + i * 7).collect();
        let t = Instant::now();
        let l = m
            .forward(
                &Array::from_slice(&prompt, &[1, 32]).unwrap(),
                &mut caches,
                Logits::Last,
            )
            .unwrap();
        l.eval().unwrap();
        let pf = t.elapsed();
        let t = Instant::now();
        for _ in 0..8 {
            let l = m
                .forward(
                    &Array::from_slice(&[5u32], &[1, 1]).unwrap(),
                    &mut caches,
                    Logits::Last,
                )
                .unwrap();
            let _ = l.argmax(-1, false).unwrap().to_vec::<u32>().unwrap();
        }
        println!(
            "{dtype:?}: prefill32 {:?}, decode/step {:?}",
            pf,
            t.elapsed() / 8
        );
    }
}
