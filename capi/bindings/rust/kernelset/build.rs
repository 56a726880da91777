//! Tests find libkernelset.so through an rpath to the directory kernelset-sys linked
//! (applications choose their own: rpath, LD_LIBRARY_PATH or an installed library).
use std::env;

fn main() {
    if let Some(dir) = env::var_os("DEP_KERNELSET_LIB_DIR") {
        let dir = dir.to_string_lossy();
        println!("cargo:rustc-link-arg-tests=-Wl,-rpath,{dir}");
    }
}
