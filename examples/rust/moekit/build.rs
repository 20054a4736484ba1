//! Lets this crate's tests and examples find libmoekit.so at run time: moekit-sys (`links = "moekit"`) hands its
//! library directory over as DEP_MOEKIT_LIBDIR, and an rpath to it goes into those binaries. A program of yours
//! that depends on `moekit` does the same in its own build script, or sets LD_LIBRARY_PATH.
fn main() {
    if let Ok(lib_dir) = std::env::var("DEP_MOEKIT_LIBDIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib_dir}");
    }
}
