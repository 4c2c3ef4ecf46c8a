//! Element types. Names follow PyTorch (`float32`, `bfloat16`, …) because users read them in
//! error messages and checkpoint listings next to PyTorch's own.

use std::fmt;

/// The element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F64,
    F16,
    BF16,
    I64,
    I32,
    U8,
    Bool,
}

impl DType {
    /// Every dtype, in a stable order.
    pub const ALL: [DType; 8] =
        [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::I32, DType::U8, DType::Bool];

    /// Bytes per element.
    pub const fn size_in_bytes(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::U8 | DType::Bool => 1,
        }
    }

    pub const fn is_floating_point(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    /// PyTorch's name without the `torch.` prefix.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::I64 => "int64",
            DType::I32 => "int32",
            DType::U8 => "uint8",
            DType::Bool => "bool",
        }
    }

    /// Parse PyTorch names and common aliases (`float32`, `float`, `f32`, `torch.half`, `bf16`, …).
    pub fn parse(s: &str) -> Option<DType> {
        let s = s.trim().trim_start_matches("torch.").to_ascii_lowercase();
        Some(match s.as_str() {
            "float32" | "float" | "f32" => DType::F32,
            "float64" | "double" | "f64" => DType::F64,
            "float16" | "half" | "f16" | "fp16" => DType::F16,
            "bfloat16" | "bf16" => DType::BF16,
            "int64" | "long" | "i64" => DType::I64,
            "int32" | "int" | "i32" => DType::I32,
            "uint8" | "u8" | "byte" => DType::U8,
            "bool" => DType::Bool,
            _ => return None,
        })
    }

    /// The dtype code used in safetensors headers.
    pub const fn safetensors_name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F64 => "F64",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::I64 => "I64",
            DType::I32 => "I32",
            DType::U8 => "U8",
            DType::Bool => "BOOL",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::parse(d.name()), Some(d));
        }
        assert_eq!(DType::parse("torch.half"), Some(DType::F16));
        assert_eq!(DType::parse("complex64"), None);
    }
}
