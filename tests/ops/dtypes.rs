//! Host round trips for every element type, and half-precision conversions
//! against the `half` crate.

use crate::common::*;
use mlx_backend::{bf16, f16, Array, Dtype, Element, HostDataError};

#[track_caller]
fn round_trip<T: Element + PartialEq + std::fmt::Debug>(data: &[T]) {
    let n = data.len() as i32;
    let a = arr(data, &[2, n / 2]);
    assert_eq!(a.dtype(), T::DTYPE);
    assert_eq!(a.nbytes(), data.len() * T::DTYPE.size());
    assert_eq!(a.to_vec::<T>().unwrap(), data, "{}", T::DTYPE);
}

#[test]
fn host_round_trip_every_dtype() {
    let mut rng = Rng::new(61);
    let mut bits = || rng.next_u64();
    let n = 64;
    round_trip(&(0..n).map(|_| bits() & 1 == 1).collect::<Vec<bool>>());
    round_trip(&(0..n).map(|_| bits() as u8).collect::<Vec<_>>());
    round_trip(&(0..n).map(|_| bits() as u16).collect::<Vec<_>>());
    round_trip(&(0..n).map(|_| bits() as u32).collect::<Vec<_>>());
    round_trip(&(0..n).map(|_| bits()).collect::<Vec<u64>>());
    round_trip(&(0..n).map(|_| bits() as i8).collect::<Vec<_>>());
    round_trip(&(0..n).map(|_| bits() as i16).collect::<Vec<_>>());
    round_trip(&(0..n).map(|_| bits() as i32).collect::<Vec<_>>());
    round_trip(&(0..n).map(|_| bits() as i64).collect::<Vec<_>>());
    // Finite floats from random bit patterns, so every exponent shows up.
    let f16s: Vec<f16> = (0..)
        .map(|_| f16::from_bits(bits() as u16))
        .filter(|v: &f16| v.is_finite())
        .take(n)
        .collect();
    round_trip(&f16s);
    let bf16s: Vec<bf16> = (0..)
        .map(|_| bf16::from_bits(bits() as u16))
        .filter(|v: &bf16| v.is_finite())
        .take(n)
        .collect();
    round_trip(&bf16s);
    let f32s: Vec<f32> = (0..)
        .map(|_| f32::from_bits(bits() as u32))
        .filter(|v: &f32| v.is_finite())
        .take(n)
        .collect();
    round_trip(&f32s);
    let f64s: Vec<f64> = (0..)
        .map(|_| f64::from_bits(bits()))
        .filter(|v: &f64| v.is_finite())
        .take(n)
        .collect();
    round_trip(&f64s);
}

/// f32 values spanning half's normal, subnormal and overflow ranges, plus ties.
fn half_probe_values(rng: &mut Rng) -> Vec<f32> {
    let mut v: Vec<f32> = (0..4000)
        .map(|_| {
            let mag = 10f64.powf(rng.uniform(-9.0, 5.5));
            let sign = if rng.below(2) == 0 { 1.0 } else { -1.0 };
            (sign * mag) as f32
        })
        .collect();
    v.extend([
        0.0,
        -0.0,
        1.0,
        65504.0,
        65520.0,
        1e-8,
        6.1e-5,
        1.0 + 1.0 / 2048.0,
        1.0 + 3.0 / 2048.0,
    ]);
    v.extend([f32::INFINITY, f32::NEG_INFINITY, 3.0e38]);
    v
}

#[test]
fn astype_to_f16_matches_half() {
    let mut rng = Rng::new(62);
    let x = half_probe_values(&mut rng);
    let a = arr(&x, &[x.len() as i32]);
    let h = a.astype(Dtype::F16).unwrap();
    let expected: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
    let got = h.to_vec::<f16>().unwrap();
    for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
        assert_eq!(g.to_bits(), e.to_bits(), "f16 of {} (element {i})", x[i]);
    }
    let back = h.astype(Dtype::F32).unwrap().to_vec::<f32>().unwrap();
    let expected: Vec<f32> = expected.iter().map(|v| v.to_f32()).collect();
    assert_eq!(back, expected, "f32 -> f16 -> f32");
}

#[test]
fn astype_to_bf16_matches_half() {
    let mut rng = Rng::new(63);
    let x: Vec<f32> = half_probe_values(&mut rng)
        .into_iter()
        .map(|v| v * 1e10)
        .chain([1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0, f32::MAX])
        .collect();
    let a = arr(&x, &[x.len() as i32]);
    let b = a.astype(Dtype::BF16).unwrap();
    let got = b.to_vec::<bf16>().unwrap();
    for (i, (g, &v)) in got.iter().zip(&x).enumerate() {
        assert_eq!(
            g.to_bits(),
            bf16::from_f32(v).to_bits(),
            "bf16 of {v} (element {i})"
        );
    }
    let back = b.astype(Dtype::F32).unwrap().to_vec::<f32>().unwrap();
    let expected: Vec<f32> = x.iter().map(|&v| bf16::from_f32(v).to_f32()).collect();
    assert_eq!(back, expected, "f32 -> bf16 -> f32");
}

#[test]
fn half_arithmetic_within_tolerance() {
    let mut rng = Rng::new(64);
    let (x, a) = rng.array(&[128]);
    let (y, b) = rng.array(&[128]);
    for dtype in [Dtype::F16, Dtype::BF16] {
        let tol = if dtype == Dtype::F16 { 2e-3 } else { 1.6e-2 };
        let out = a
            .astype(dtype)
            .unwrap()
            .mul(&b.astype(dtype).unwrap())
            .unwrap();
        assert_eq!(out.dtype(), dtype);
        let expected: Vec<f64> = x
            .iter()
            .zip(&y)
            .map(|(&p, &q)| p as f64 * q as f64)
            .collect();
        assert_close(
            &f32s(&out),
            &expected,
            tol,
            tol,
            &format!("{dtype} multiply"),
        );
    }
}

#[test]
fn constructors_and_metadata() {
    let z = Array::zeros(&[2, 3], Dtype::I16).unwrap();
    assert_eq!(
        (z.shape(), z.dtype(), z.size(), z.nbytes()),
        (vec![2, 3], Dtype::I16, 6, 12)
    );
    assert_eq!(z.to_vec::<i16>().unwrap(), vec![0; 6]);
    assert_eq!(
        Array::ones(&[4], Dtype::U8)
            .unwrap()
            .to_vec::<u8>()
            .unwrap(),
        vec![1; 4]
    );
    let f = Array::full(&[3], 2.5, Dtype::BF16).unwrap();
    assert_eq!(f.to_vec::<bf16>().unwrap(), vec![bf16::from_f32(2.5); 3]);
    let r = Array::arange(1.0, 2.0, 0.25, Dtype::F32).unwrap();
    assert_eq!(r.to_vec::<f32>().unwrap(), vec![1.0, 1.25, 1.5, 1.75]);
    let s = Array::scalar(-7i64);
    assert_eq!((s.ndim(), s.item::<i64>().unwrap()), (0, -7));
    assert_eq!(Array::from_f32(1.5).item::<f32>().unwrap(), 1.5);
    assert_eq!(z.dim(-1).unwrap(), 3);
    let empty = arr::<f32>(&[], &[0, 4]);
    assert_eq!(empty.to_vec::<f32>().unwrap(), Vec::<f32>::new());
    for (d, size, name) in [
        (Dtype::Bool, 1, "bool"),
        (Dtype::F16, 2, "float16"),
        (Dtype::BF16, 2, "bfloat16"),
        (Dtype::U32, 4, "uint32"),
        (Dtype::F64, 8, "float64"),
        (Dtype::Complex64, 8, "complex64"),
    ] {
        assert_eq!((d.size(), d.to_string()), (size, name.to_string()));
    }
    assert!(Dtype::BF16.is_float() && !Dtype::I32.is_float());
}

#[test]
fn host_reads_check_the_type() {
    let a = arr(&[1.0f32, 2.0], &[2]);
    match a.to_vec::<i32>() {
        Err(HostDataError::DtypeMismatch { actual, requested }) => {
            assert_eq!((actual, requested), (Dtype::F32, Dtype::I32));
        }
        other => panic!("expected a dtype mismatch, got {other:?}"),
    }
    assert!(matches!(
        a.item::<f32>(),
        Err(HostDataError::NotScalar { .. })
    ));
    assert!(matches!(
        Array::from_slice(&[1.0f32, 2.0, 3.0], &[2, 2]),
        Err(HostDataError::LengthMismatch { .. })
    ));
    assert!(Array::from_slice::<f32>(&[], &[-1]).is_err());
    assert_still_works();
}
