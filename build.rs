//! Finds MLX (pinned to 0.32.4), compiles the C++ bridge and the Primitives
//! against it, and links `libmlx` with an rpath into its wheel layout.
//!
//! Discovery order (first match wins):
//! 1. `MLX_DIR`: a folder holding `include/` and `lib/` (a wheel's `mlx` folder qualifies);
//! 2. `MLX_USE_PYTHON=1`: the `mlx` package importable by `$MLX_PYTHON` (default `python3`);
//! 3. otherwise the pinned wheels are installed with pip into a per-user cache.
//!
//! libmlx finds its BLAS (and, for CUDA, its headers) relative to itself, so it is
//! always linked in place, never copied.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "build/cuda.rs"]
mod cuda;
#[path = "build/metal.rs"]
mod metal;

const MLX_VERSION: &str = "0.32.4";

/// Every environment variable this script reads goes through here, so that each
/// one is registered with `rerun-if-env-changed` exactly once.
fn env_var(name: &str) -> Option<String> {
    println!("cargo:rerun-if-env-changed={name}");
    env::var(name).ok().filter(|v| !v.is_empty())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Backend {
    Cpu,
    Cuda,
    /// macOS: MLX's only macOS build is its Metal one (`mlx-metal`); the
    /// `metal` feature decides whether this crate's Metal bodies are built.
    Metal,
}

impl Backend {
    fn from_env() -> Backend {
        if target_is_macos() {
            Backend::Metal
        } else if env_var("CARGO_FEATURE_CUDA").is_some() {
            Backend::Cuda
        } else {
            Backend::Cpu
        }
    }

    fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Cuda => "cuda-13",
            Backend::Metal => "metal",
        }
    }

    /// The pip requirements that provide libmlx for this backend (installed
    /// without dependencies, so each wheel holding a part is named).
    fn wheels(self) -> Vec<String> {
        let mut wheels = vec![format!("mlx=={MLX_VERSION}")];
        match self {
            Backend::Cpu => wheels.push(format!("mlx-cpu=={MLX_VERSION}")),
            Backend::Cuda => wheels.push(format!("mlx-cuda-13=={MLX_VERSION}")),
            // libmlx.dylib, mlx.metallib and the headers (metal_cpp included).
            Backend::Metal => wheels.push(format!("mlx-metal=={MLX_VERSION}")),
        }
        wheels
    }
}

/// Whether the target (not the host running this script) is macOS.
fn target_is_macos() -> bool {
    env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "macos")
}

/// Whether this build compiles the Metal bodies: macOS with feature `metal`
/// (a default feature, without effect elsewhere).
fn metal_bodies(backend: Backend) -> bool {
    backend == Backend::Metal && env_var("CARGO_FEATURE_METAL").is_some()
}

fn fail(message: &str) -> ! {
    panic!("\n\nmlx-backend build: {message}\n\n");
}

fn main() {
    let backend = Backend::from_env();
    let mlx_dir = find_mlx(backend);
    let include_dir = mlx_dir.join("include");
    let lib_dir = mlx_dir.join("lib");
    check_version(&include_dir);

    compile_bridge(backend, &mlx_dir, &include_dir);

    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=dylib=mlx");
    if backend == Backend::Metal {
        // The Metal bodies' metal-cpp calls; libmlx links the same ones.
        for framework in ["Metal", "Foundation", "QuartzCore", "Accelerate"] {
            println!("cargo:rustc-link-lib=framework={framework}");
        }
    }
    // This package's own tests, examples and benches find libmlx in place.
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib_dir.display());
    // Exported to dependents as DEP_MLX_LIB_DIR / DEP_MLX_INCLUDE / DEP_MLX_ROOT.
    println!("cargo:lib_dir={}", lib_dir.display());
    println!("cargo:include={}", include_dir.display());
    println!("cargo:root={}", mlx_dir.display());
    println!(
        "cargo:rustc-env=MLX_BACKEND_MLX_LIB_DIR={}",
        lib_dir.display()
    );
}

fn find_mlx(backend: Backend) -> PathBuf {
    if let Some(dir) = env_var("MLX_DIR") {
        let dir = PathBuf::from(dir);
        if !dir.join("include/mlx/mlx.h").is_file() || !dir.join("lib").is_dir() {
            fail(&format!(
                "MLX_DIR={} does not hold include/mlx/mlx.h and lib/. \
                 Point it at a folder with both (a wheel's site-packages/mlx folder qualifies), \
                 or unset it to let the build fetch MLX {MLX_VERSION}.",
                dir.display()
            ));
        }
        return dir;
    }
    if env_var("MLX_USE_PYTHON").is_some_and(|v| v != "0") {
        return mlx_from_python();
    }
    mlx_from_cache(backend)
}

fn python() -> String {
    env_var("MLX_PYTHON").unwrap_or_else(|| "python3".to_string())
}

fn mlx_from_python() -> PathBuf {
    let python = python();
    let output = Command::new(&python)
        .args([
            "-c",
            "import mlx, os; print(os.path.dirname(mlx.__path__[0] + '/x'))",
        ])
        .output()
        .unwrap_or_else(|e| {
            fail(&format!(
                "MLX_USE_PYTHON=1 but `{python}` could not be run ({e}). \
                 Set MLX_PYTHON to a Python with mlx=={MLX_VERSION} installed, or set MLX_DIR."
            ))
        });
    if !output.status.success() {
        fail(&format!(
            "MLX_USE_PYTHON=1 but `{python} -c 'import mlx'` failed:\n{}\n\
             Remedy: `{python} -m pip install mlx=={MLX_VERSION} mlx-cpu=={MLX_VERSION}`, or set MLX_DIR.",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    if !dir.join("include/mlx/mlx.h").is_file() {
        fail(&format!(
            "the mlx package at {} has no include/mlx/mlx.h. \
             Install the wheel build (`pip install mlx=={MLX_VERSION}`), or set MLX_DIR.",
            dir.display()
        ));
    }
    dir
}

fn cache_root() -> PathBuf {
    if let Some(dir) = env_var("MLX_BACKEND_CACHE") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = env_var("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("mlx-backend");
    }
    match env_var("HOME") {
        Some(home) => PathBuf::from(home).join(".cache").join("mlx-backend"),
        None => fail(
            "neither MLX_BACKEND_CACHE, XDG_CACHE_HOME nor HOME is set, so there is no cache \
             to fetch MLX into. Set MLX_BACKEND_CACHE, or point MLX_DIR at an MLX install.",
        ),
    }
}

/// Installs the pinned wheels with pip into `<cache>/mlx-<version>-<backend>` once.
/// The wheel layout is kept as pip writes it (`mlx/lib/libmlx.so` next to the
/// `mlx_cpu.libs` it loads through its own rpath).
fn mlx_from_cache(backend: Backend) -> PathBuf {
    let target = cache_root().join(format!("mlx-{MLX_VERSION}-{}", backend.name()));
    let mlx_dir = target.join("mlx");
    if mlx_dir.join("include/mlx/mlx.h").is_file() && mlx_dir.join("lib").is_dir() {
        return mlx_dir;
    }
    let partial = target.with_extension("partial");
    let _ = std::fs::remove_dir_all(&partial);
    let python = python();
    // The CPU and Metal wheels need nothing else; the CUDA wheel needs its
    // NVIDIA runtime wheels.
    let mut cmd = pip_install(&python, &partial, backend != Backend::Cuda);
    cmd.args(backend.wheels());
    println!(
        "cargo:warning=fetching MLX {MLX_VERSION} ({}) with pip into {}",
        backend.name(),
        target.display()
    );
    let status = cmd.status().unwrap_or_else(|e| {
        fail(&format!(
            "could not run `{python} -m pip` to fetch MLX {MLX_VERSION} ({e}). \
             Install pip, or set MLX_DIR to an MLX install (a wheel's `mlx` folder), \
             or MLX_USE_PYTHON=1 with mlx installed."
        ))
    });
    if !status.success() {
        fail(&format!(
            "`pip install {}` failed (offline, or no wheel for this platform). \
             Set MLX_DIR to a folder holding MLX {MLX_VERSION}'s include/ and lib/ \
             (e.g. site-packages/mlx of an installed wheel), or MLX_USE_PYTHON=1.",
            backend.wheels().join(" ")
        ));
    }
    let _ = std::fs::remove_dir_all(&target);
    std::fs::rename(&partial, &target).unwrap_or_else(|e| {
        fail(&format!(
            "could not move {} to {} ({e}); check permissions on the cache, \
             or set MLX_BACKEND_CACHE to a writable folder.",
            partial.display(),
            target.display()
        ))
    });
    mlx_dir
}

/// `python -m pip install` into `target` (quiet, no prompts); the caller
/// adds the requirements.
fn pip_install(python: &str, target: &Path, no_deps: bool) -> Command {
    let mut cmd = Command::new(python);
    cmd.args([
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-input",
        "--quiet",
    ]);
    if no_deps {
        cmd.arg("--no-deps");
    }
    cmd.arg("--target").arg(target);
    cmd
}

fn check_version(include_dir: &Path) {
    let header = include_dir.join("mlx/version.h");
    let text = std::fs::read_to_string(&header).unwrap_or_else(|e| {
        fail(&format!(
            "cannot read {} ({e}); the MLX install is incomplete. Reinstall MLX {MLX_VERSION} or fix MLX_DIR.",
            header.display()
        ))
    });
    let part = |name: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(&format!("#define {name} ")))
            .map(|v| v.trim().to_string())
            .unwrap_or_default()
    };
    let found = format!(
        "{}.{}.{}",
        part("MLX_VERSION_MAJOR"),
        part("MLX_VERSION_MINOR"),
        part("MLX_VERSION_PATCH")
    );
    if found != MLX_VERSION {
        fail(&format!(
            "found MLX {found} at {}, but this crate is pinned to MLX {MLX_VERSION}. \
             Install `mlx=={MLX_VERSION}` there, or unset MLX_DIR / MLX_USE_PYTHON to fetch the pinned wheels.",
            include_dir.display()
        ));
    }
}

/// The C++ translation units: the MLX bridge and one Primitive per kernel
/// folder, plus the backend files of this build's GPU backend (`cuda.cpp`
/// and `cuda_*.cpp` with feature `cuda`; `metal.cpp` and `metal_*.cpp` on
/// macOS with feature `metal`).
fn cpp_sources(backend: Backend) -> Vec<PathBuf> {
    let root = Path::new("mlx-kernels-cpp");
    let mut sources = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| fail(&format!("cannot list {} ({e})", dir.display())));
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
            let wanted = match stem.split('_').next() {
                Some("cuda") => backend == Backend::Cuda,
                Some("metal") => metal_bodies(backend),
                _ => true,
            };
            if wanted && path.extension().is_some_and(|e| e == "cpp") {
                sources.push(path);
            }
        }
    }
    sources.sort();
    sources
}

/// The cxx bridges: the MLX-facing one (`extern "C++"` only), the
/// registry's callbacks for GPU bodies, and each kernel's CPU body
/// callbacks. C++ includes their generated headers as
/// `mlx-backend/<path>.h`.
const BRIDGES: &[&str] = &[
    "mlx-backend/ffi.rs",
    "mlx-backend/kernels/registry_bridge.rs",
    "mlx-backend/kernels/attention/bridge.rs",
    "mlx-backend/kernels/decoder_layer/bridge.rs",
    "mlx-backend/kernels/gate_qmv_silu_mul/bridge.rs",
    "mlx-backend/kernels/moe_combine/bridge.rs",
    "mlx-backend/kernels/quantized_matmul/bridge.rs",
    "mlx-backend/kernels/rms_norm/bridge.rs",
];

fn compile_bridge(backend: Backend, mlx_dir: &Path, include_dir: &Path) {
    let sources = cpp_sources(backend);
    let mut build = cxx_build::bridges(BRIDGES);
    build
        .files(&sources)
        .std("c++20")
        .include(include_dir)
        .include("mlx-kernels-cpp")
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        .flag_if_supported("-Wno-missing-field-initializers")
        .opt_level(2);
    if backend == Backend::Cuda {
        let out_dir =
            PathBuf::from(env::var("OUT_DIR").unwrap_or_else(|_| fail("OUT_DIR is not set")));
        let toolkit = cuda::toolkit(env_var, &cache_root(), &python(), pip_install, fail);
        let fatbins = cuda::compile_fatbins(
            &toolkit,
            Path::new("mlx-kernels-cpp"),
            include_dir,
            &out_dir,
            fail,
        );
        // MLX's CUDA headers include cuda.h and {fmt}; the wheels ship neither.
        build
            .define("MLX_BACKEND_CUDA", None)
            .include(fatbins)
            .include(&toolkit.include)
            .include(mlx_dir.join("../nvidia/cu13/include"))
            .include("mlx-kernels-cpp/common/fmt_shim");
    }
    if metal_bodies(backend) {
        let out_dir =
            PathBuf::from(env::var("OUT_DIR").unwrap_or_else(|_| fail("OUT_DIR is not set")));
        let metallib = metal::compile_metallib(
            env_var,
            Path::new("mlx-kernels-cpp"),
            include_dir,
            &out_dir,
            fail,
        );
        // metal-cpp sits in the wheel's include/metal_cpp; a Homebrew or
        // source install may keep it elsewhere under include/.
        let metal_cpp = [include_dir.join("metal_cpp"), include_dir.join("metal-cpp")]
            .into_iter()
            .find(|d| d.join("Metal/Metal.hpp").is_file())
            .unwrap_or_else(|| include_dir.to_path_buf());
        build
            .define("MLX_BACKEND_METAL", None)
            .define(
                "MLX_BACKEND_METALLIB",
                Some(format!("{:?}", metallib.display().to_string()).as_str()),
            )
            .define(
                "MLX_BACKEND_METAL_LIBRARY",
                Some(format!("{:?}", metal::LIBRARY_NAME).as_str()),
            )
            .include(metal_cpp);
        println!(
            "cargo:rustc-env=MLX_BACKEND_METALLIB={}",
            metallib.display()
        );
    }
    build.compile("mlx_backend_bridge");
    for bridge in BRIDGES {
        println!("cargo:rerun-if-changed={bridge}");
    }
    println!("cargo:rerun-if-changed=mlx-kernels-cpp");
    println!("cargo:rerun-if-changed=build/cuda.rs");
    println!("cargo:rerun-if-changed=build/metal.rs");
    for source in &sources {
        println!("cargo:rerun-if-changed={}", source.display());
    }
}
