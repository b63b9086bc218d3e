//! The Metal bodies' shaders, compiled ahead of time: every
//! `mlx-kernels-cpp/<op>/*.metal` becomes one `.air` with Apple's `metal`
//! compiler and all of them one `mlx_backend.metallib` in OUT_DIR, as MLX's
//! extension example `axpby` builds its library (`mlx_build_metallib`).
//! The library is also copied next to the target's binaries; the host side
//! (`common/metal_launch.cpp`) loads it through
//! `metal::device(..).get_library(name, path)`.
//!
//! Why ahead of time rather than MLX's `fast::metal_kernel` (JIT): shader
//! errors fail the build on the developer's Mac instead of the first decode
//! step on a user's, templates and shared headers (`common/metal_*.h`)
//! work as in any Metal source, and no compile cost lands on the first
//! evaluation. `fast::metal_kernel` also builds its own Primitive, while
//! these bodies sit behind this crate's Primitives (fallback graph, vjp,
//! failure memory).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The library's name as `get_library` caches it.
pub const LIBRARY_NAME: &str = "mlx_backend";

/// The Metal compiler: `MLX_BACKEND_METAL_CC` (`overridden`, a command
/// line split on whitespace) or `xcrun -sdk macosx metal`.
fn compiler(overridden: Option<&str>) -> Vec<String> {
    match overridden {
        Some(cc) => cc.split_whitespace().map(str::to_string).collect(),
        None => ["xcrun", "-sdk", "macosx", "metal"]
            .map(str::to_string)
            .to_vec(),
    }
}

/// The `.metal` sources under `root`, one folder deep (`<op>/*.metal`), sorted.
pub fn sources(root: &Path, fail: fn(&str) -> !) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let dirs = std::fs::read_dir(root)
        .unwrap_or_else(|e| fail(&format!("cannot list {} ({e})", root.display())));
    for dir in dirs.flatten().map(|e| e.path()).filter(|p| p.is_dir()) {
        let files = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| fail(&format!("cannot list {} ({e})", dir.display())));
        for path in files.flatten().map(|e| e.path()) {
            if path.extension().is_some_and(|e| e == "metal") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

fn run(mut cmd: Command, what: &str, fail: fn(&str) -> !) {
    let status = cmd.status().unwrap_or_else(|e| {
        fail(&format!(
            "could not run the Metal compiler for {what} ({e}). Install Xcode (or its \
             command line tools with the Metal toolchain: `xcodebuild -downloadComponent \
             MetalToolchain`), set MLX_BACKEND_METAL_CC to a Metal compiler, or build \
             without the Metal bodies (`--no-default-features --features hub`)."
        ))
    });
    if !status.success() {
        fail(&format!(
            "the Metal compiler failed on {what} (its errors are above)"
        ));
    }
}

/// Compiles every shader into `<out_dir>/mlx_backend.metallib` and returns
/// its path. `mlx_include` holds MLX's headers (the kernels include its
/// `bf16.h`); `root` is `mlx-kernels-cpp` (the shaders include
/// `common/metal_common.h` and `common/metal_qmv.h`).
pub fn compile_metallib(
    env_var: fn(&str) -> Option<String>,
    root: &Path,
    mlx_include: &Path,
    out_dir: &Path,
    fail: fn(&str) -> !,
) -> PathBuf {
    let cc_env = env_var("MLX_BACKEND_METAL_CC");
    let cc = compiler(cc_env.as_deref());
    if cc.is_empty() {
        fail("MLX_BACKEND_METAL_CC is set but names no command");
    }
    let air_dir = out_dir.join("metal");
    let _ = std::fs::create_dir_all(&air_dir);
    let mut airs = Vec::new();
    for source in sources(root, fail) {
        println!("cargo:rerun-if-changed={}", source.display());
        let stem = format!(
            "{}_{}",
            source
                .parent()
                .and_then(|p| p.file_name())
                .and_then(|s| s.to_str())
                .unwrap_or("op"),
            source
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("kernels")
        );
        let air = air_dir.join(format!("{stem}.air"));
        let mut cmd = Command::new(&cc[0]);
        cmd.args(&cc[1..])
            // As MLX builds its own kernels: exact IEEE arithmetic (the
            // bodies match the unfused graph's roundings), Metal 3.1 for
            // native bfloat (macOS 14).
            .args([
                "-x",
                "metal",
                "-Wall",
                "-Wextra",
                "-fno-fast-math",
                "-std=metal3.1",
            ])
            .arg("-mmacosx-version-min=14.0")
            .arg("-I")
            .arg(root)
            .arg("-I")
            .arg(mlx_include)
            .arg("-c")
            .arg(&source)
            .arg("-o")
            .arg(&air);
        run(cmd, &source.display().to_string(), fail);
        airs.push(air);
    }
    for header in ["common/metal_common.h", "common/metal_qmv.h"] {
        println!("cargo:rerun-if-changed={}", root.join(header).display());
    }
    let lib = out_dir.join(format!("{LIBRARY_NAME}.metallib"));
    // metallib sits beside metal in the toolchain; an overridden compiler
    // names its own folder's metallib.
    let mut cmd = match cc_env {
        Some(_)
            if Path::new(&cc[0])
                .parent()
                .is_some_and(|d| d.join("metallib").is_file()) =>
        {
            Command::new(
                Path::new(&cc[0])
                    .parent()
                    .unwrap_or(Path::new("."))
                    .join("metallib"),
            )
        }
        _ => {
            let mut c = Command::new("xcrun");
            c.args(["-sdk", "macosx", "metallib"]);
            c
        }
    };
    cmd.args(&airs).arg("-o").arg(&lib);
    run(cmd, "mlx_backend.metallib", fail);
    // Next to the binaries (target/<profile>/, where tests and examples
    // look first): OUT_DIR is target/<profile>/build/<pkg>-<hash>/out.
    if let Some(profile_dir) = out_dir.ancestors().nth(3) {
        let _ = std::fs::copy(&lib, profile_dir.join(format!("{LIBRARY_NAME}.metallib")));
    }
    lib
}
