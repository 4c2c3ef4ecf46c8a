//! The builder setters of the optimizers' hyperparameter structs (`SgdConfig::new(0.1)
//! .momentum(0.9)`), written once: every optimizer's config had the same three-line setter per
//! field.

/// `pub fn field(mut self, field: T) -> Self` for each listed field of a config struct.
macro_rules! config_setters {
    ($config:ty { $($(#[$doc:meta])* $field:ident: $ty:ty),+ $(,)? }) => {
        impl $config {
            $(
                $(#[$doc])*
                pub fn $field(mut self, $field: $ty) -> Self {
                    self.$field = $field;
                    self
                }
            )+
        }
    };
}
pub(crate) use config_setters;
