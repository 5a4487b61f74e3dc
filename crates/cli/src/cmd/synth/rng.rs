//! Seeded normal deviates: SplitMix64 for the bits, Box-Muller for the shape. Every row chunk of every
//! tensor draws from its own stream, keyed by (seed, tensor name, chunk index), so the file's bytes do
//! not depend on the thread count or on the order chunks are computed in.

use std::f64::consts::TAU;

/// SplitMix64 (Steele, Lea, Flood 2014): one 64-bit state, a full-period, well-mixed output.
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator starting at `seed`.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    /// Uniform in (0, 1]: 53 random bits, never 0 (Box-Muller takes its log).
    fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Fills `out` with `mean + std * N(0, 1)`.
    pub fn fill_normal(&mut self, out: &mut [f32], mean: f32, std: f32) {
        let mut pairs = out.chunks_exact_mut(2);
        for p in &mut pairs {
            let (a, b) = self.pair();
            p[0] = mean + std * a;
            p[1] = mean + std * b;
        }
        if let [last] = pairs.into_remainder() {
            *last = mean + std * self.pair().0;
        }
    }

    fn pair(&mut self) -> (f32, f32) {
        let (u1, u2) = (self.unit(), self.unit());
        let r = (-2.0 * u1.ln()).sqrt();
        let (s, c) = (TAU * u2).sin_cos();
        ((r * c) as f32, (r * s) as f32)
    }
}

/// SplitMix64's output function, also used to derive stream keys.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a of a tensor name: the name, not its position, keys its stream.
pub fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// The stream of chunk `chunk` of tensor `name` under `seed`.
pub fn stream(seed: u64, name: &str, chunk: u64) -> SplitMix64 {
    SplitMix64::new(mix(mix(seed ^ name_hash(name)).wrapping_add(chunk)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normals_have_the_asked_moments() {
        let mut v = vec![0f32; 200_001];
        stream(7, "t", 0).fill_normal(&mut v, 1.0, 0.5);
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
        assert!((mean - 1.0).abs() < 0.01, "{mean}");
        assert!((var.sqrt() - 0.5).abs() < 0.01, "{var}");
    }

    #[test]
    fn streams_are_keyed_not_shared() {
        let draw = |seed, name, chunk| {
            let mut v = [0f32; 4];
            stream(seed, name, chunk).fill_normal(&mut v, 0.0, 1.0);
            v
        };
        assert_eq!(draw(1, "a", 0), draw(1, "a", 0));
        assert_ne!(draw(1, "a", 0), draw(1, "a", 1));
        assert_ne!(draw(1, "a", 0), draw(1, "b", 0));
        assert_ne!(draw(1, "a", 0), draw(2, "a", 0));
    }
}
