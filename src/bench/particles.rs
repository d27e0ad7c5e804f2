//! The HACC-IO checkpoint of one process: nine particle arrays (positions
//! `xx yy zz`, velocities `vx vy vz`, potential `phi` as f32, id `pid` as i64,
//! `mask` as u16: 38 bytes a particle), written one after another, little-endian.
//! Every value is a function of (rank, array, index), so a restart can check
//! another process's file element by element.

use super::pattern::splitmix64;

/// The arrays, in file order, with their element size.
pub const ARRAYS: [(&str, u64); 9] = [
    ("xx", 4),
    ("yy", 4),
    ("zz", 4),
    ("vx", 4),
    ("vy", 4),
    ("vz", 4),
    ("phi", 4),
    ("pid", 8),
    ("mask", 2),
];

/// Bytes a particle takes over all arrays.
pub const PARTICLE_BYTES: u64 = 38;

/// Size of a checkpoint file of `particles` particles.
pub fn file_bytes(particles: u64) -> u64 {
    particles * PARTICLE_BYTES
}

/// Byte range of array `a` in a file of `particles` particles.
pub fn array_range(a: usize, particles: u64) -> std::ops::Range<u64> {
    assert!(a < ARRAYS.len(), "array {a} out of range");
    let start: u64 = ARRAYS[..a].iter().map(|(_, b)| b * particles).sum();
    start..start + ARRAYS[a].1 * particles
}

fn value_bits(rank: u32, a: usize, i: u64) -> u64 {
    splitmix64(((rank as u64) << 48) ^ ((a as u64) << 40) ^ i)
}

/// Element `i` of array `a` of `rank`: its little-endian bytes as an integer
/// (the element's size is the array's).
fn element(rank: u32, a: usize, i: u64) -> u64 {
    let h = value_bits(rank, a, i);
    match a {
        // A float in [a, a + 1): finite, and different for every array.
        0..=6 => u64::from(((h >> 40) as f32 / 16_777_216.0 + a as f32).to_bits()),
        7 => (((rank as i64) << 40) | i as i64) as u64,
        8 => (h >> 48) as u16 as u64,
        _ => unreachable!("nine arrays"),
    }
}

/// Appends element `i` of array `a` of `rank` to `out`.
fn encode(out: &mut Vec<u8>, rank: u32, a: usize, i: u64) {
    let size = ARRAYS[a].1 as usize;
    out.extend_from_slice(&element(rank, a, i).to_le_bytes()[..size]);
}

/// The whole checkpoint of `rank`, as the file must hold it.
pub fn generate(rank: u32, particles: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(file_bytes(particles) as usize);
    for a in 0..ARRAYS.len() {
        for i in 0..particles {
            encode(&mut out, rank, a, i);
        }
    }
    assert_eq!(out.len() as u64, file_bytes(particles));
    out
}

/// Checks `data` as `rank`'s checkpoint of `particles` particles; the error
/// names the array and the particle that is wrong.
pub fn verify(data: &[u8], rank: u32, particles: u64) -> Result<(), String> {
    if data.len() as u64 != file_bytes(particles) {
        return Err(format!(
            "checkpoint is {} bytes, expected {} ({particles} particles x {PARTICLE_BYTES} bytes)",
            data.len(),
            file_bytes(particles)
        ));
    }
    // Elements compared as integers: a slice comparison per element is a
    // `memcmp` call each, which made the check cost more CPU than the reads.
    for (a, (name, elem)) in ARRAYS.iter().enumerate() {
        let range = array_range(a, particles);
        let bytes = &data[range.start as usize..range.end as usize];
        for (i, got) in bytes.chunks_exact(*elem as usize).enumerate() {
            let found = match got.len() {
                2 => u64::from(u16::from_le_bytes(got.try_into().expect("2 bytes"))),
                4 => u64::from(u32::from_le_bytes(got.try_into().expect("4 bytes"))),
                _ => u64::from_le_bytes(got.try_into().expect("8 bytes")),
            };
            let want = element(rank, a, i as u64);
            if found != want {
                let want = &want.to_le_bytes()[..got.len()];
                return Err(format!(
                    "array {name} particle {i} (offset {}): expected bytes {want:02x?}, found {got:02x?}",
                    range.start + i as u64 * elem
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flipped_byte_in_any_array_is_found_there() {
        let good = generate(3, 50);
        for (a, (name, elem)) in ARRAYS.iter().enumerate() {
            let range = array_range(a, 50);
            for byte in [0, *elem - 1] {
                let mut bad = good.clone();
                bad[(range.start + 7 * elem + byte) as usize] ^= 0x10;
                let e = verify(&bad, 3, 50).unwrap_err();
                assert!(e.contains(&format!("array {name} particle 7 ")), "{e}");
            }
        }
    }

    #[test]
    fn generated_checkpoints_verify_and_differ_by_rank() {
        let a = generate(0, 100);
        let b = generate(1, 100);
        assert_eq!(a.len(), 3800);
        assert_eq!(verify(&a, 0, 100), Ok(()));
        assert_ne!(a, b);
        let e = verify(&b, 0, 100).unwrap_err();
        assert!(e.contains("array xx particle 0"), "{e}");
    }

    #[test]
    fn a_corrupt_particle_is_named() {
        let mut data = generate(2, 50);
        let pid = array_range(7, 50);
        data[(pid.start + 8 * 13) as usize] ^= 1;
        let e = verify(&data, 2, 50).unwrap_err();
        assert!(e.contains("array pid particle 13"), "{e}");
    }

    #[test]
    fn a_short_checkpoint_is_caught() {
        let data = generate(0, 10);
        let e = verify(&data[..379], 0, 10).unwrap_err();
        assert!(e.contains("379 bytes, expected 380"), "{e}");
    }

    #[test]
    fn arrays_tile_the_file() {
        assert_eq!(array_range(0, 10), 0..40);
        assert_eq!(array_range(8, 10).end, file_bytes(10));
        assert_eq!(ARRAYS.iter().map(|(_, b)| b).sum::<u64>(), PARTICLE_BYTES);
    }
}
