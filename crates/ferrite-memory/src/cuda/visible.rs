//! `CUDA_VISIBLE_DEVICES` read the way the CUDA driver reads it, as a pure function.
//!
//! Why ferrite parses a variable the driver already applies: the driver applies it silently. A
//! list that makes no GPU visible (`CUDA_VISIBLE_DEVICES=""`, `-1`, an index past the last card, a
//! mistyped UUID) leaves the driver with zero devices, and "no CUDA device" is then all a user
//! learns. Reading the list ourselves turns that into an error naming the entry that ended it.
//!
//! CUDA's rules: a comma-separated list of device indices or GPU UUIDs (`GPU-8e1c…`, any unique
//! prefix of one; `MIG-…` for a MIG instance). The visible devices are those listed, in the order
//! listed, renumbered from 0; the list ends at the first entry that is not valid (garbage, an
//! index the machine does not have, a UUID matching no GPU or several, a device listed twice),
//! and the entries before it stay visible. An empty value makes no device visible.

/// What a `CUDA_VISIBLE_DEVICES` value selects on a machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaVisible {
    /// Physical device indices (in the driver's unrestricted order), as the process will number
    /// them: `devices[0]` becomes ordinal 0.
    pub devices: Vec<usize>,
    /// Why the list ended before its last entry (the entry and the reason), if it did.
    pub stopped: Option<String>,
}

impl CudaVisible {
    /// Why this list makes no device visible, in words (`None` when it makes some visible).
    pub fn why_empty(&self, value: &str) -> Option<String> {
        if !self.devices.is_empty() {
            return None;
        }
        Some(match &self.stopped {
            _ if value.trim().is_empty() => "the list is empty".to_string(),
            Some(why) => format!("{why}, and CUDA stops reading the list at its first invalid entry"),
            None => "it names no device".to_string(),
        })
    }
}

/// The devices `value` makes visible on a machine whose GPUs have the UUIDs `physical` (in the
/// driver's order; `GPU-xxxxxxxx-xxxx-…` as `nvidia-smi -L` prints them). Never fails: an invalid
/// entry ends the list, as it does for CUDA, and [`CudaVisible::stopped`] says which and why.
pub fn parse_cuda_visible_devices(value: &str, physical: &[String]) -> CudaVisible {
    let mut devices: Vec<usize> = Vec::new();
    if value.trim().is_empty() {
        return CudaVisible { devices, stopped: None };
    }
    for entry in value.split(',') {
        let e = entry.trim();
        let found = match resolve(e, physical) {
            Ok(i) if devices.contains(&i) => Err(format!("`{e}` names device {i} a second time")),
            other => other,
        };
        match found {
            Ok(i) => devices.push(i),
            Err(why) => return CudaVisible { devices, stopped: Some(why) },
        }
    }
    CudaVisible { devices, stopped: None }
}

/// The physical index an entry names.
fn resolve(e: &str, physical: &[String]) -> Result<usize, String> {
    let n = physical.len();
    if !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit()) {
        let i: usize = e.parse().map_err(|_| format!("`{e}` is not a device index"))?;
        return if i < n {
            Ok(i)
        } else {
            Err(format!(
                "`{e}` names device {i}, but this machine has {n} NVIDIA GPU(s){}",
                if n == 0 { String::new() } else { format!(" (0..={})", n - 1) }
            ))
        };
    }
    if e.starts_with("MIG-") {
        return Err(format!(
            "`{e}` is a MIG instance, which ferrite does not resolve (it reads GPU indices and `GPU-` UUIDs)"
        ));
    }
    if e.starts_with("GPU-") && e.len() > "GPU-".len() {
        let hits: Vec<usize> = physical.iter().enumerate().filter(|(_, u)| u.starts_with(e)).map(|(i, _)| i).collect();
        return match hits.as_slice() {
            [i] => Ok(*i),
            [] => Err(format!("`{e}` matches no GPU's UUID (`nvidia-smi -L` lists them)")),
            _ => Err(format!("`{e}` matches the UUIDs of {} GPUs; write more of it", hits.len())),
        };
    }
    Err(format!("`{e}` is neither a device index nor a GPU UUID (`GPU-…`)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uuids() -> Vec<String> {
        vec![
            "GPU-8e1c2a44-1111-2222-3333-444455556666".to_string(),
            "GPU-8e9f0b12-aaaa-bbbb-cccc-ddddeeeeffff".to_string(),
            "GPU-03a7c9d1-0000-0000-0000-000000000000".to_string(),
        ]
    }

    #[test]
    fn indices_and_uuid_prefixes_select_and_renumber() {
        let p = uuids();
        assert_eq!(parse_cuda_visible_devices("2,0", &p), CudaVisible { devices: vec![2, 0], stopped: None });
        assert_eq!(parse_cuda_visible_devices(" 1 ", &p).devices, vec![1]);
        assert_eq!(parse_cuda_visible_devices("GPU-03a7,GPU-8e1c", &p).devices, vec![2, 0]);
        assert_eq!(parse_cuda_visible_devices("GPU-8e9f0b12-aaaa-bbbb-cccc-ddddeeeeffff", &p).devices, vec![1]);
    }

    #[test]
    fn an_invalid_entry_ends_the_list_and_keeps_what_came_before() {
        let p = uuids();
        for (value, kept, says) in [
            ("0,2,-1,1", vec![0, 2], "`-1` is neither"),
            ("1,7,0", vec![1], "names device 7, but this machine has 3 NVIDIA GPU(s) (0..=2)"),
            ("0,,1", vec![0], "`` is neither"),
            ("0,0", vec![0], "a second time"),
            ("GPU-8e,1", vec![], "matches the UUIDs of 2 GPUs"),
            ("GPU-ffff", vec![], "matches no GPU's UUID"),
            ("2,MIG-abc", vec![2], "MIG instance"),
            ("gpu0", vec![], "neither a device index"),
        ] {
            let v = parse_cuda_visible_devices(value, &p);
            assert_eq!(v.devices, kept, "{value}");
            let why = v.stopped.unwrap_or_default();
            assert!(why.contains(says), "{value}: {why}");
        }
    }

    #[test]
    fn the_reason_a_list_makes_nothing_visible() {
        let p = uuids();
        let why = |v: &str| parse_cuda_visible_devices(v, &p).why_empty(v);
        assert_eq!(why("").unwrap(), "the list is empty");
        assert_eq!(why("  ").unwrap(), "the list is empty");
        assert!(why("-1").unwrap().contains("`-1` is neither") && why("-1").unwrap().contains("stops reading"));
        assert!(why("5").unwrap().contains("has 3 NVIDIA GPU(s)"));
        assert_eq!(why("1"), None);
        // On a machine without NVIDIA GPUs every index is past the end.
        let none = parse_cuda_visible_devices("0", &[]);
        assert!(none.why_empty("0").unwrap().contains("this machine has 0 NVIDIA GPU(s), and"), "{none:?}");
    }
}
