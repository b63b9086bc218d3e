//! Request lifecycles leave MLX's active memory at its baseline. Alone in
//! its binary: active memory is process-wide, so no other test may run
//! beside it.

mod common;
use common::settled_active_memory;

use common::tiny::{runner, tokens};
use mlx_backend::runner::*;

#[test]
fn request_lifecycles_leave_memory_at_baseline() {
    let mut r = runner(5);
    let cycle = |r: &mut MlxModelRunner, i: u64| {
        let p = tokens(i, 3 + (i % 5) as usize);
        let t = r
            .forward(&ForwardBatch::new(
                ForwardMode::Extend,
                vec![RequestInput::prompt(i, p.clone(), SamplingParams::greedy())],
            ))
            .unwrap()
            .outputs[0]
            .next_token
            .unwrap();
        r.forward(&ForwardBatch::new(
            ForwardMode::Decode,
            vec![RequestInput::decode(
                i,
                t,
                p.len(),
                SamplingParams::greedy(),
            )],
        ))
        .unwrap();
        r.release(&[i]);
    };
    for i in 0..20 {
        cycle(&mut r, i);
    }
    r.clear_pool();
    mlx_backend::memory::clear_cache();
    let baseline = settled_active_memory();
    for i in 0..1000 {
        cycle(&mut r, 100 + i);
    }
    r.clear_pool();
    mlx_backend::memory::clear_cache();
    assert_eq!(settled_active_memory(), baseline);
    assert_eq!(r.metrics().active_requests, 0);
}
