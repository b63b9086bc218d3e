use mlx_backend::{Array, Dtype};

#[test]
fn add_and_read_back() {
    let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    let b = Array::from_slice(&[10.0f32, 20.0], &[2]).unwrap();
    let c = a.add(&b).unwrap();
    assert_eq!(c.shape(), vec![2, 2]);
    assert_eq!(c.to_vec::<f32>().unwrap(), vec![11.0, 22.0, 13.0, 24.0]);
    let t = a.transpose(&[]).unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0, 3.0, 2.0, 4.0]);
    assert!(a
        .matmul(&Array::zeros(&[3, 3], Dtype::F32).unwrap())
        .is_err());
    assert_eq!(a.sum(&[], false).unwrap().item::<f32>().unwrap(), 10.0);
}
