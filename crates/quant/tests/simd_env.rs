//! `HEARTH_KERNELS` caps the kernel level. Its own test binary (one test), because the level is
//! decided once per process.

use hearth_quant::simd::{cpu_level, kernel_level, Level};

#[test]
fn hearth_kernels_env_caps_the_level() {
    // Runs before anything else in this process reads the level.
    std::env::set_var("HEARTH_KERNELS", "avx2");
    let want = Level::Avx2.min(cpu_level());
    assert_eq!(kernel_level(), want);
    println!(
        "HEARTH_KERNELS=avx2 on a CPU with {} gives {}",
        cpu_level(),
        kernel_level()
    );
}
