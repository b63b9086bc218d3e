//! Bad calls give `Err` with a message, never an abort, and the process keeps
//! computing afterwards. File errors are in `files.rs`.

use crate::common::*;
use mlx_backend::ops::{
    concatenate, quantize, scaled_dot_product_attention, AttentionMask, Quantized,
};
use mlx_backend::{Array, Dtype, OpError};

/// The op failed with a message naming it, and the next op works.
#[track_caller]
fn assert_op_err(r: Result<Array, OpError>, op: &str) {
    let e = r.expect_err("expected an error");
    assert_eq!(e.op, op);
    assert!(!e.message.is_empty(), "{op}: empty message");
    assert!(e.to_string().starts_with(op), "{e}");
    assert_still_works();
}

fn f32_array(shape: &[i32]) -> Array {
    Rng::new(shape.len() as u64 + 70).array(shape).1
}

#[test]
fn shape_mismatches() {
    let a = f32_array(&[2, 3]);
    assert_op_err(a.matmul(&f32_array(&[4, 5])), "matmul");
    assert_op_err(
        f32_array(&[2, 2, 3]).matmul(&f32_array(&[3, 3, 4])),
        "matmul",
    );
    assert_op_err(a.add(&f32_array(&[4])), "add");
    assert_op_err(a.mul(&f32_array(&[3, 2])), "mul");
    assert_op_err(a.reshape(&[4, 2]), "reshape");
    assert_op_err(a.reshape(&[-1, -1]), "reshape");
    assert_op_err(a.broadcast_to(&[3, 3]), "broadcast_to");
    assert_op_err(concatenate(&[&a, &f32_array(&[3, 2])], 1), "concatenate");
    assert_op_err(
        a.slice_update(&f32_array(&[3, 3]), &[0, 0], &[2, 3], &[]),
        "slice_update",
    );
    assert_op_err(
        scaled_dot_product_attention(
            &f32_array(&[1, 3, 2, 8]),
            &f32_array(&[1, 2, 2, 8]),
            &f32_array(&[1, 2, 2, 8]),
            1.0,
            AttentionMask::None,
        ),
        "scaled_dot_product_attention",
    );
}

#[test]
fn bad_axes() {
    let a = f32_array(&[2, 3]);
    assert_op_err(a.sum(&[2], false), "sum");
    assert_op_err(a.max(&[-3], false), "max");
    assert_op_err(a.argmax(5, false), "argmax");
    assert_op_err(a.transpose(&[0, 0]), "transpose");
    assert_op_err(a.transpose(&[0, 1, 2]), "transpose");
    assert_op_err(a.squeeze(&[0]), "squeeze");
    assert_op_err(a.softmax(&[3], false), "softmax");
    assert_op_err(a.cumsum(2, false, true), "cumsum");
    assert_op_err(a.sort(-5), "sort");
    assert_op_err(a.topk(4, 1), "topk");
    assert_op_err(a.slice_axis(2, 0, 1), "slice_axis");
    assert_op_err(Array::from_f32(1.0).t(), "t");
    assert!(a.dim(2).is_err());
    assert_still_works();
}

#[test]
fn quantized_ops_check_dtypes_and_parameters() {
    let w = f32_array(&[8, 64]);
    for (group, bits) in [(64, 7), (48, 4), (64, 16), (0, 4), (64, 0), (-64, 4)] {
        let e = quantize(&w, group, bits).expect_err("bad quantize parameters");
        assert_eq!(e.op, "quantize", "group {group} bits {bits}");
        assert_still_works();
    }
    // K not a multiple of the group size.
    assert!(quantize(&f32_array(&[8, 40]), 32, 4).is_err());
    // quantize needs a float matrix.
    assert!(quantize(&Array::zeros(&[8, 64], Dtype::I32).unwrap(), 64, 4).is_err());
    assert!(quantize(&f32_array(&[64]), 64, 4).is_err());

    let good = quantize(&w, 64, 4).unwrap();
    let float_weight = Quantized {
        weight: w.clone(),
        ..good.clone()
    };
    let x = f32_array(&[2, 64]);
    assert_op_err(float_weight.matmul(&x, true), "quantized_matmul");
    assert_op_err(float_weight.dequantize(), "dequantize");
    let idx = arr(&[0u32], &[1]);
    assert_op_err(
        float_weight.gather_matmul(&x, None, Some(&idx), true, false),
        "gather_qmm",
    );
    // Parameters that disagree with the packed shapes.
    let wrong_bits = Quantized {
        bits: 8,
        ..good.clone()
    };
    assert_op_err(wrong_bits.matmul(&x, true), "quantized_matmul");
    let wrong_group = Quantized {
        group_size: 32,
        ..good.clone()
    };
    assert_op_err(wrong_group.dequantize(), "dequantize");
    // Zero parameters (MLX divides by them before checking them).
    for (group_size, bits) in [(0, 4), (64, 0)] {
        let zero = Quantized {
            group_size,
            bits,
            ..good.clone()
        };
        assert_op_err(zero.matmul(&x, true), "quantized_matmul");
        assert_op_err(zero.dequantize(), "dequantize");
        assert_op_err(
            zero.gather_matmul(&x, None, Some(&idx), true, false),
            "gather_qmm",
        );
    }
    // Activations of the wrong width.
    assert_op_err(good.matmul(&f32_array(&[2, 32]), true), "quantized_matmul");
    assert_still_works();
}

#[test]
fn other_bad_arguments() {
    let a = f32_array(&[2, 3]);
    assert_op_err(Array::full(&[-1, 2], 0.0, Dtype::F32), "full");
    assert_op_err(a.take(&f32_array(&[2]), 0), "take");
    assert_op_err(
        a.gather_mm(
            &f32_array(&[2, 3, 4]),
            None,
            Some(&arr(&[0.5f32], &[1])),
            false,
        ),
        "gather_mm",
    );
    assert_op_err(
        a.rope(
            3,
            false,
            10000.0,
            1.0,
            mlx_backend::ops::RopeOffset::Static(0),
            None,
        ),
        "rope",
    );
    assert_op_err(a.rms_norm_mlx(Some(&f32_array(&[4])), 1e-5), "rms_norm");
    assert_op_err(
        mlx_backend::ops::random::split(&f32_array(&[3]), 2),
        "random.split",
    );
}

/// MLX checks shapes while the graph is built; what fails only at eval time
/// on the CPU is the allocation of an output buffer. An array of 2^41 float32
/// elements (8 TiB) passes every build-time check; MLX's CPU allocator would
/// return a null buffer for it and crash, so the bridge refuses it at eval.
#[test]
fn failure_during_evaluation_is_an_error() {
    let huge = Array::zeros(&[1 << 20, 1 << 21], Dtype::F32).expect("the graph builds");
    let doubled = huge.add_scalar(1.0).unwrap();
    let e = doubled.eval().expect_err("8 TiB cannot be allocated");
    assert!(!e.message.is_empty());
    assert!(e.to_string().starts_with("evaluation failed"), "{e}");
    drop((huge, doubled));
    assert_still_works();
    // A host read of such an array reports the same failure.
    let huge = Array::ones(&[1 << 20, 1 << 21], Dtype::F32).unwrap();
    assert!(huge.sum(&[], false).unwrap().item::<f32>().is_err());
    assert_still_works();
}
