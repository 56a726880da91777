//! Links libkernelset.so from $KS_LIB_DIR, or from the Python package's install location
//! (src/kernelset/capi/lib, where scripts/build_capi.sh puts it) when the variable is unset.
//! Dependents read the directory as DEP_KERNELSET_LIB_DIR (for an rpath in their tests).
use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=KS_LIB_DIR");
    let dir = match env::var_os("KS_LIB_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
            manifest.join("../../../../src/kernelset/capi/lib")
        }
    };
    let dir = dir.canonicalize().unwrap_or(dir);
    println!("cargo:rerun-if-changed={}", dir.join("libkernelset.so").display());
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=dylib=kernelset");
    println!("cargo:lib_dir={}", dir.display());
}
