//! `HEARTH_KERNELS` caps the kernel set. Its own test binary (one test), because the set is decided
//! once per process.

use hearth_quant::simd::{cpu_isa, cpu_level, kernel_isa, kernel_level, Isa, Level};

#[test]
fn hearth_kernels_env_caps_the_level() {
    // Runs before anything else in this process reads the set. `avx2` is plain AVX2 (no
    // AVX-VNNI) even on a CPU that has more, so a fast machine can stand in for an older one.
    std::env::set_var("HEARTH_KERNELS", "avx2");
    let want = if Isa::Avx2.supported() {
        Isa::Avx2
    } else {
        Isa::Scalar
    };
    assert_eq!(kernel_isa(), want);
    assert_eq!(kernel_level(), Level::Avx2.min(cpu_level()));
    println!(
        "HEARTH_KERNELS=avx2 on a CPU with {} gives {}",
        cpu_isa(),
        kernel_isa()
    );
}
