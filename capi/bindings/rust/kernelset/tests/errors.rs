//! Failure classes through the safe layer: each returns its status and a message naming the
//! argument; the thread-local message is per thread and cleared by a successful call; the
//! function table matches the linked symbols.
use std::ffi::c_void;

use kernelset::*;

fn rows(n: usize) -> Vec<f32> {
    (0..n).map(|i| (i as f32 * 0.37).sin()).collect()
}

fn expect_err(r: Result<()>, status: Status, names: &str) -> KsError {
    let e = r.expect_err("the call should fail");
    assert_eq!(e.status, status, "{e}");
    assert!(e.message.contains(names), "message {:?} does not name {names:?}", e.message);
    e
}

#[test]
fn wrong_dtype_is_unsupported_dtype() {
    let x = vec![1i32; 4 * 8];
    let mut y = vec![0f32; 4 * 8];
    let r = softmax(
        &Tensor::new(&x, &[4, 8]).unwrap(),
        &mut TensorMut::new(&mut y, &[4, 8]).unwrap(),
        None,
        Stream::DEFAULT,
    );
    expect_err(r, Status::UnsupportedDtype, "x");
}

#[test]
fn mismatched_shape_is_invalid_argument() {
    let x = rows(4 * 16);
    let mut y = vec![0f32; 4 * 8];
    let r = rms_norm(
        &Tensor::new(&x, &[4, 16]).unwrap(),
        None,
        &mut TensorMut::new(&mut y, &[4, 8]).unwrap(),
        None,
        Stream::DEFAULT,
    );
    expect_err(r, Status::InvalidArgument, "out");
}

#[test]
fn bad_option_value_is_invalid_argument() {
    let x = rows(2 * 16);
    let mut y = vec![0f32; 2 * 16];
    let mut o = RmsNormOptions::defaults(Op::RmsNorm).unwrap();
    assert_eq!(o.size, std::mem::size_of::<RmsNormOptions>());
    assert_eq!((o.eps, o.offset, o.cast), (1e-6, 0.0, sys::KS_NORM_CAST_LLAMA));
    o.eps = -1.0;
    let r = rms_norm(
        &Tensor::new(&x, &[2, 16]).unwrap(),
        None,
        &mut TensorMut::new(&mut y, &[2, 16]).unwrap(),
        Some(&o),
        Stream::DEFAULT,
    );
    expect_err(r, Status::InvalidArgument, "eps");
    // a size that is not a prefix of whole fields of the struct
    let mut o = RmsNormOptions::defaults(Op::RmsNorm).unwrap();
    o.size = 3;
    let r = rms_norm(
        &Tensor::new(&x, &[2, 16]).unwrap(),
        None,
        &mut TensorMut::new(&mut y, &[2, 16]).unwrap(),
        Some(&o),
        Stream::DEFAULT,
    );
    expect_err(r, Status::InvalidArgument, "size");
}

#[test]
fn overlapping_output_rows_are_an_unsupported_layout() {
    let x = rows(4 * 16);
    let mut y = vec![0f32; 16];
    // every row of out at the same address (row stride 0): the library must refuse to write it
    let mut out = TensorMut::with_strides(&mut y, DType::F32, &[4, 16], &[0, 1]).unwrap();
    let r = rms_norm(&Tensor::new(&x, &[4, 16]).unwrap(), None, &mut out, None, Stream::DEFAULT);
    expect_err(r, Status::UnsupportedLayout, "out");
}

#[test]
fn tensors_on_two_devices_are_an_unsupported_device() {
    let x = rows(2 * 16);
    // a CUDA pointer is never dereferenced: the device check comes first
    let fake = 0x7000_0000usize as *mut c_void;
    let mut out = unsafe { TensorMut::from_raw(fake, DType::F32, &[2, 16], None, Device::Cuda(0)) };
    let r = rms_norm(&Tensor::new(&x, &[2, 16]).unwrap(), None, &mut out, None, Stream::DEFAULT);
    expect_err(r, Status::UnsupportedDevice, "out");
}

#[test]
fn a_missing_major_version_is_a_version_error() {
    let e = api_table(sys::KS_ABI_VERSION_MAJOR + 1, 0).expect_err("no table of the next major");
    assert_eq!(e.status, Status::Version);
    assert!(!e.message.is_empty());
    let e = api_table(sys::KS_ABI_VERSION_MAJOR, 1 << 20).expect_err("no table of a far minor");
    assert_eq!(e.status, Status::Version);
}

#[test]
fn query_support_refuses_without_running() {
    let x = vec![1i64; 8];
    let y = vec![0f32; 8];
    let (xt, yt) = (Tensor::new(&x, &[2, 4]).unwrap(), Tensor::new(&y, &[2, 4]).unwrap());
    let r = query_support::<SoftmaxOptions>(Op::Softmax, &[Some(&xt), Some(&yt)], None);
    expect_err(r, Status::UnsupportedDtype, "x");
    let r = query_support::<SoftmaxOptions>(Op::Softmax, &[Some(&xt)], None);
    let e = r.expect_err("wrong tensor count");
    assert_eq!(e.status, Status::InvalidArgument, "{e}");
    let x = rows(8);
    let xt = Tensor::new(&x, &[2, 4]).unwrap();
    query_support::<SoftmaxOptions>(Op::Softmax, &[Some(&xt), Some(&yt)], None).unwrap();
}

#[test]
fn views_outside_their_slice_are_refused_before_the_call() {
    let x = rows(10);
    let e = Tensor::new(&x, &[4, 4]).expect_err("16 elements from a slice of 10");
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.contains("needs 64 bytes"), "{}", e.message);
    let e = Tensor::with_strides(&x, DType::F32, &[2, 4], &[8, 1]).expect_err("row 1 ends at element 12");
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(Tensor::with_strides(&x, DType::F32, &[2, 4], &[-4, 1]).is_err());
    let b = [0u8; 9];
    assert!(Tensor::new_as(&b[1..], DType::F32, &[2]).is_err() || (b[1..].as_ptr() as usize) % 4 == 0);
}

#[test]
fn messages_are_per_thread_and_cleared_by_success() {
    let x = vec![1i32; 8];
    let mut y = vec![0f32; 8];
    let bad = softmax(
        &Tensor::new(&x, &[2, 4]).unwrap(),
        &mut TensorMut::new(&mut y, &[2, 4]).unwrap(),
        None,
        Stream::DEFAULT,
    );
    let msg = bad.unwrap_err().message;
    assert_eq!(last_error(), msg);
    std::thread::spawn(|| assert_eq!(last_error(), "", "another thread sees no message")).join().unwrap();
    let x = rows(8);
    softmax(&Tensor::new(&x, &[2, 4]).unwrap(), &mut TensorMut::new(&mut y, &[2, 4]).unwrap(), None, Stream::DEFAULT)
        .unwrap();
    assert_eq!(last_error(), "");
    let sum: f32 = y[..4].iter().sum();
    assert!((sum - 1.0).abs() < 1e-6, "softmax row sums to {sum}");
}

#[test]
fn status_names_and_versions() {
    assert_eq!(Status::InvalidArgument.name(), "KS_ERR_INVALID_ARGUMENT");
    assert_eq!(Status::UnsupportedLayout.name(), "KS_ERR_UNSUPPORTED_LAYOUT");
    assert_eq!(status_name(sys::KS_OK), "KS_OK");
    assert_eq!(abi_version(), (sys::KS_ABI_VERSION_MAJOR, sys::KS_ABI_VERSION_MINOR));
    let info = build_info();
    assert!(info.starts_with("kernelset ") && info.contains("abi 1."), "{info}");
    for code in 1..=11 {
        let s = Status::from_code(code).unwrap();
        assert_eq!(s.code(), code);
        assert_eq!(s.name(), status_name(code));
    }
}

#[test]
fn fused_add_rms_norm_in_place_matches_out_of_place() {
    let x = rows(3 * 32);
    let w: Vec<f32> = (0..32).map(|i| 0.5 + i as f32 / 64.0).collect();
    let r0: Vec<f32> = (0..96).map(|i| (i as f32 * 0.11).cos()).collect();
    let (mut r1, mut r2, mut out, mut xi) = (r0.clone(), r0.clone(), vec![0f32; 96], x.clone());
    let wt = Tensor::new(&w, &[32]).unwrap();
    fused_add_rms_norm(
        &Tensor::new(&x, &[3, 32]).unwrap(),
        &mut TensorMut::new(&mut r1, &[3, 32]).unwrap(),
        Some(&wt),
        &mut TensorMut::new(&mut out, &[3, 32]).unwrap(),
        None,
        Stream::DEFAULT,
    )
    .unwrap();
    fused_add_rms_norm_inplace(
        &mut TensorMut::new(&mut xi, &[3, 32]).unwrap(),
        &mut TensorMut::new(&mut r2, &[3, 32]).unwrap(),
        Some(&wt),
        None,
        Stream::DEFAULT,
    )
    .unwrap();
    assert_eq!(out, xi);
    assert_eq!(r1, r2);
    assert!((r1[5] - (x[5] + r0[5])).abs() < 1e-6);
}
