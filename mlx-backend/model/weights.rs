//! The tensors of a checkpoint by HF name, whatever file they came from, and
//! the typed lookups layers use (shape checks, quantized companions).

use super::config::QuantConfig;
use super::error::ModelLoadError;
use crate::kernels::ActivationPrecision;
use crate::ops::{QuantSpec, Quantized};
use crate::Array;
use std::collections::BTreeMap;

pub struct Weights {
    tensors: BTreeMap<String, Array>,
    quantization: Option<QuantConfig>,
    /// GGUF files carry no quantization config: group 32, bits from shapes.
    infer_quantization: bool,
    /// What the quantized layers built from these weights ask their kernels for.
    activations: ActivationPrecision,
    /// The dtype [`Weights::cast_floats`] cast to, if it ran.
    float_dtype: Option<crate::Dtype>,
    /// The tensor-parallel group these weights are one rank's shard for.
    tensor_parallel: Option<crate::distributed::Group>,
}

impl Weights {
    pub fn new(
        tensors: BTreeMap<String, Array>,
        quantization: Option<QuantConfig>,
        infer_quantization: bool,
    ) -> Weights {
        Weights {
            tensors,
            quantization,
            infer_quantization,
            activations: ActivationPrecision::Exact,
            float_dtype: None,
            tensor_parallel: None,
        }
    }

    /// Mark these weights as one rank's shard (see `model::shard`): the
    /// layers built from them sum their partial outputs over `group`.
    pub fn set_tensor_parallel(&mut self, group: crate::distributed::Group) {
        self.tensor_parallel = Some(group);
    }

    /// The group the layers sum their partial outputs over, if sharded.
    pub fn tensor_parallel(&self) -> Option<&crate::distributed::Group> {
        self.tensor_parallel.as_ref()
    }

    /// The tensors by name, for sharding before the layers are built.
    pub fn tensors_mut(&mut self) -> &mut BTreeMap<String, Array> {
        &mut self.tensors
    }

    pub fn set_activations(&mut self, activations: ActivationPrecision) {
        self.activations = activations;
    }

    /// The activation precision of quantized layers (from `LoadOptions`).
    pub fn activations(&self) -> ActivationPrecision {
        self.activations
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    pub fn get(&self, name: &str) -> Result<Array, ModelLoadError> {
        self.tensors
            .get(name)
            .cloned()
            .ok_or_else(|| ModelLoadError::MissingTensor(name.into()))
    }

    /// A tensor that must have exactly `shape`.
    pub fn get_shaped(&self, name: &str, shape: &[i32]) -> Result<Array, ModelLoadError> {
        let a = self.get(name)?;
        if a.shape() != shape {
            return Err(ModelLoadError::WrongShape {
                name: name.into(),
                expected: shape.to_vec(),
                found: a.shape(),
            });
        }
        Ok(a)
    }

    /// The quantized matrix at `prefix` (`prefix.weight` + `.scales` + `.biases`),
    /// or None when the checkpoint stores it unquantized. `in_features` is K.
    pub fn quantized(
        &self,
        prefix: &str,
        in_features: usize,
    ) -> Result<Option<Quantized>, ModelLoadError> {
        let scales_name = format!("{prefix}.scales");
        if !self.contains(&scales_name) {
            return Ok(None);
        }
        let weight_name = format!("{prefix}.weight");
        let weight = self.get(&weight_name)?;
        let scales = self.get(&scales_name)?;
        let biases = self.get(&format!("{prefix}.biases"))?;
        let (w_shape, s_shape) = (weight.shape(), scales.shape());
        let (Some(&packed), Some(&groups)) = (w_shape.last(), s_shape.last()) else {
            return Err(bad(&weight_name, "quantized weight must have rank >= 1"));
        };
        if weight.dtype() != crate::Dtype::U32 {
            return Err(bad(
                &weight_name,
                &format!("packed weight must be uint32, is {}", weight.dtype()),
            ));
        }
        if groups <= 0 || in_features as i32 % groups != 0 {
            return Err(bad(
                &scales_name,
                &format!("{groups} groups do not divide {in_features} inputs"),
            ));
        }
        let group_size = in_features as i32 / groups;
        let bits = packed * 32 / in_features as i32;
        if packed * 32 != bits * in_features as i32 {
            return Err(bad(
                &weight_name,
                &format!("packed width {packed} fits no bit width for {in_features} inputs"),
            ));
        }
        if let Some(c) = self.configured(prefix) {
            if c != (QuantSpec { bits, group_size }) {
                return Err(bad(
                    &weight_name,
                    &format!(
                        "config says group {} / {} bits, shapes say group {group_size} / {bits} bits",
                        c.group_size, c.bits
                    ),
                ));
            }
        } else if !self.infer_quantization {
            return Err(bad(
                &weight_name,
                "quantized tensors but no quantization config",
            ));
        }
        Ok(Some(Quantized {
            weight,
            scales,
            biases,
            group_size,
            bits,
        }))
    }

    fn configured(&self, prefix: &str) -> Option<QuantSpec> {
        let q = self.quantization.as_ref()?;
        for (path, o) in &q.overrides {
            if path == prefix {
                return *o;
            }
        }
        Some(q.default)
    }

    /// Cast every floating tensor (norms, dense weights) to `dtype`, except
    /// the scales and biases of quantized tensors: widening those adds no
    /// precision, only bytes for every decode step to read (the quantized
    /// kernels widen them per group), so they keep the checkpoint's dtype
    /// unless `dtype` is narrower.
    pub fn cast_floats(&mut self, dtype: crate::Dtype) -> Result<(), ModelLoadError> {
        let quant_params: Vec<String> = self
            .tensors
            .keys()
            .filter(|n| {
                let prefix = n
                    .strip_suffix(".scales")
                    .or_else(|| n.strip_suffix(".biases"));
                prefix.is_some_and(|p| {
                    self.tensors
                        .get(&format!("{p}.weight"))
                        .is_some_and(|w| w.dtype() == crate::Dtype::U32)
                })
            })
            .cloned()
            .collect();
        for (name, a) in self.tensors.iter_mut() {
            let keep = quant_params.contains(name) && dtype.size() >= a.dtype().size();
            if a.dtype().is_float() && a.dtype() != dtype && !keep {
                *a = a.astype(dtype)?;
            }
        }
        self.float_dtype = Some(dtype);
        Ok(())
    }

    /// The dtype floating tensors were cast to ([`Weights::cast_floats`]).
    pub fn float_dtype(&self) -> Option<crate::Dtype> {
        self.float_dtype
    }

    /// Quantize every dense 2-D+ `*.weight` of a linear layer (not norms or
    /// embeddings when `skip` says so) in place, with `spec`.
    pub fn quantize_linears(
        &mut self,
        spec: QuantSpec,
        skip: impl Fn(&str) -> bool,
    ) -> Result<(), ModelLoadError> {
        let names: Vec<String> = self
            .tensors
            .iter()
            .filter(|(n, a)| {
                n.ends_with(".weight") && a.ndim() >= 2 && a.dtype().is_float() && !skip(n)
            })
            .map(|(n, _)| n.clone())
            .collect();
        for name in names {
            let prefix = name.trim_end_matches(".weight").to_string();
            let q = crate::ops::quantize(&self.tensors[&name], spec.group_size, spec.bits)?;
            self.tensors.insert(name, q.weight);
            self.tensors.insert(format!("{prefix}.scales"), q.scales);
            self.tensors.insert(format!("{prefix}.biases"), q.biases);
        }
        self.quantization = Some(QuantConfig {
            default: spec,
            overrides: Vec::new(),
        });
        Ok(())
    }
}

fn bad(name: &str, message: &str) -> ModelLoadError {
    ModelLoadError::BadTensor {
        name: name.into(),
        message: message.into(),
    }
}
