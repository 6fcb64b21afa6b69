//! How configuration structs are declared: open to read, closed to build.
//!
//! Why. A configuration struct with public fields is easy to read and to
//! print, but a caller outside the crate that builds one with a struct
//! literal breaks as soon as a field is added. So each is
//! `#[non_exhaustive]` (no literal outside the crate) and comes with one
//! chainable setter per field, documented as the field is:
//! `CacheConfig::default().arc_max_bytes(4 << 30)`. `settings!` declares
//! both from one list, so they cannot drift apart.

/// Declares a `#[non_exhaustive]` settings struct and a setter per field.
macro_rules! settings {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $(
                $(#[$field_meta:meta])*
                pub $field:ident: $ty:ty,
            )*
        }
    ) => {
        $(#[$meta])*
        #[non_exhaustive]
        pub struct $name {
            $(
                $(#[$field_meta])*
                pub $field: $ty,
            )*
        }

        impl $name {
            $(
                $(#[$field_meta])*
                ///
                /// (A setter: returns the settings with this one changed.)
                #[must_use]
                pub fn $field(mut self, value: $ty) -> Self {
                    self.$field = value;
                    self
                }
            )*
        }
    };
}

pub(crate) use settings;
