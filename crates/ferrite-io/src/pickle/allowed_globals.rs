//! Which globals a checkpoint may name, and why everything else is refused.
//!
//! A pickle names a global (`module.name`) to call it or to construct an instance of it; that is
//! how a pickled model or a hostile file runs code. A weights-only state_dict only needs PyTorch's
//! tensor rebuild functions, typed storages, `OrderedDict` and a few value types, so this list is
//! closed: anything else is refused at the moment the pickle names it — before any call — with an
//! error that says what the global is and why it cannot be loaded.

use ferrite_tensor::DType;

use super::heap::Global;
use crate::error::IoError;

/// Resolves `module.name` to an allowed global or the refusal a user should read.
pub(crate) fn resolve(module: &str, name: &str) -> Result<Global, IoError> {
    let builtins = matches!(module, "builtins" | "__builtin__");
    let g = match (module, name) {
        ("collections", "OrderedDict") => Global::OrderedDict,
        ("torch._utils", "_rebuild_tensor") => Global::RebuildTensor,
        ("torch._utils", "_rebuild_tensor_v2") => Global::RebuildTensorV2,
        ("torch._utils", "_rebuild_parameter") => Global::RebuildParameter,
        ("torch._utils", "_rebuild_parameter_with_state") => Global::RebuildParameterWithState,
        ("torch._tensor", "_rebuild_from_type_v2") => Global::RebuildFromTypeV2,
        ("torch", "Tensor") | ("torch.nn.parameter", "Parameter") | ("torch.nn", "Parameter") => Global::TensorType,
        ("torch", "Size") => Global::Size,
        ("torch", "device") => Global::Device,
        ("_codecs", "encode") => Global::CodecsEncode,
        (_, "set" | "frozenset") if builtins => Global::Set,
        ("torch" | "torch.storage", "UntypedStorage") => Global::StorageType(Ok(DType::U8)),
        ("torch", storage) if storage_dtype(storage).is_some() => {
            Global::StorageType(storage_dtype(storage).unwrap_or(Err("unknown")))
        }
        ("torch", dtype) if torch_dtype(dtype).is_some() => Global::TorchDtype(torch_dtype(dtype).unwrap_or("unknown")),
        _ => return Err(refusal(module, name)),
    };
    Ok(g)
}

/// The element type of a PyTorch typed-storage class; `Some(Err(name))` for types ferrite lacks.
fn storage_dtype(class: &str) -> Option<Result<DType, &'static str>> {
    Some(match class {
        "FloatStorage" => Ok(DType::F32),
        "DoubleStorage" => Ok(DType::F64),
        "HalfStorage" => Ok(DType::F16),
        "BFloat16Storage" => Ok(DType::BF16),
        "LongStorage" => Ok(DType::I64),
        "IntStorage" => Ok(DType::I32),
        "ByteStorage" => Ok(DType::U8),
        "BoolStorage" => Ok(DType::Bool),
        "ShortStorage" => Err("int16"),
        "CharStorage" => Err("int8"),
        "ComplexFloatStorage" => Err("complex64"),
        "ComplexDoubleStorage" => Err("complex128"),
        "QInt8Storage" | "QUInt8Storage" | "QInt32Storage" | "QUInt4x2Storage" | "QUInt2x4Storage" => Err("quantized"),
        _ => return None,
    })
}

/// `torch.<dtype>` objects that may appear as plain values (e.g. autocast settings).
fn torch_dtype(name: &str) -> Option<&'static str> {
    const NAMES: [&str; 24] = [
        "float32",
        "float",
        "float64",
        "double",
        "float16",
        "half",
        "bfloat16",
        "int64",
        "long",
        "int32",
        "int",
        "int16",
        "short",
        "int8",
        "uint8",
        "bool",
        "complex64",
        "cfloat",
        "complex128",
        "cdouble",
        "uint16",
        "uint32",
        "uint64",
        "float8_e4m3fn",
    ];
    NAMES.iter().copied().find(|n| *n == name)
}

fn refusal(module: &str, name: &str) -> IoError {
    let reason = refusal_reason(module, name);
    IoError::UnsafeGlobal { module: module.to_string(), name: name.to_string(), reason }
}

fn refusal_reason(module: &str, name: &str) -> String {
    let root = module.split('.').next().unwrap_or(module);
    match root {
        "os" | "posix" | "nt" | "subprocess" | "pty" | "commands" | "popen2" => {
            format!(
                "it is a system function; calling it from a pickle would run commands on this machine (e.g. `{module}.{name}(\"...\")` spawns a shell)"
            )
        }
        "builtins" | "__builtin__" => match name {
            "eval" | "exec" | "compile" | "execfile" | "__import__" | "getattr" | "setattr" | "globals" | "open"
            | "input" | "breakpoint" => {
                format!(
                    "the builtin `{name}` can evaluate code, import modules or touch files; a checkpoint never needs it"
                )
            }
            _ => format!("the builtin `{name}` is not a container or number type a state_dict uses"),
        },
        "sys" | "shutil" | "socket" | "runpy" | "importlib" | "pickle" | "_pickle" | "marshal" | "code" | "ctypes"
        | "webbrowser" | "types" | "functools" | "operator" | "io" | "pathlib" | "tempfile" | "signal"
        | "threading" | "multiprocessing" => {
            format!(
                "module `{module}` gives access to the interpreter, files, processes or the network; a pickle naming it is trying to run code"
            )
        }
        "__main__" => format!(
            "`{name}` is a class defined in the script that saved the file (a whole pickled model or custom object); rebuilding it would require importing and running that code"
        ),
        "numpy" => "numpy objects are not part of a weights-only checkpoint (save tensors or Python numbers instead)"
            .to_string(),
        "torch" if module.starts_with("torch.nn.modules") || module.starts_with("torch.nn.") => {
            format!("`{name}` is a torch.nn module class: the file holds a whole pickled model, not a state_dict")
        }
        "torch" if module.starts_with("torch.optim") => {
            format!("`{name}` is a whole pickled optimizer object; save `optimizer.state_dict()` instead")
        }
        "torch" => "it is not one of the tensor, storage or container types a weights-only state_dict uses".to_string(),
        _ => format!(
            "module `{module}` is not part of a weights-only state_dict; constructing `{name}` would import and run its code"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allows_what_state_dicts_use() {
        assert_eq!(resolve("torch._utils", "_rebuild_tensor_v2").unwrap(), Global::RebuildTensorV2);
        assert_eq!(resolve("torch", "BFloat16Storage").unwrap(), Global::StorageType(Ok(DType::BF16)));
        assert_eq!(resolve("torch", "CharStorage").unwrap(), Global::StorageType(Err("int8")));
        assert_eq!(resolve("collections", "OrderedDict").unwrap(), Global::OrderedDict);
        assert_eq!(resolve("torch", "bfloat16").unwrap(), Global::TorchDtype("bfloat16"));
    }

    #[test]
    fn refuses_everything_else_with_a_reason() {
        for (m, n, needle) in [
            ("posix", "system", "run commands"),
            ("os", "system", "run commands"),
            ("builtins", "eval", "evaluate code"),
            ("__main__", "Net", "pickled model"),
            ("torch.nn.modules.linear", "Linear", "whole pickled model"),
            ("torch", "load", "not one of"),
            ("collections", "Counter", "not part of a weights-only"),
            ("torch", "FloatStorageX", "not one of"),
        ] {
            let err = resolve(m, n).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains(&format!("`{m}.{n}`")), "{msg}");
            assert!(msg.contains(needle), "{msg}");
            assert!(msg.contains("Nothing was executed"), "{msg}");
        }
    }
}
