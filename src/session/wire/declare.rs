//! The macro that turns the one declaration of every frame (in `mod.rs`)
//! into the [`Frame`](super::Frame) enum, its encoding, its decoding and
//! the layout table the docs carry: a field added to a frame is one line
//! there, and nothing else writes a layout.

/// Declares every frame type: its code, its name, who sends it, and its
/// fields in wire order, each with the Rust type the enum holds and the
/// [`Field`](super::fields::Field) that writes and reads it. A field marked
/// `[since N]` came with protocol version `N`: it goes last, it is written
/// only to peers of version `N` or later, and a frame that ends before it
/// (a peer of an older version sent it) reads it as its type's default.
macro_rules! frames {
    ($(
        $(#[doc = $doc:literal])*
        $kind:ident = $code:literal, $name:literal, $direction:literal {
            $(
                $(#[doc = $field_doc:literal])*
                $field:ident: $type:ty = $codec:ty $([since $since:expr])?,
            )*
        }
    )*) => {
        /// One frame of a session.
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub enum Frame {
            $(
                $(#[doc = $doc])*
                $kind {
                    $(
                        $(#[doc = $field_doc])*
                        $field: $type,
                    )*
                },
            )*
        }

        /// A frame's type.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(u8)]
        enum Kind {
            $($kind = $code,)*
        }

        impl Kind {
            /// Every type's code, in the declaration's order.
            const CODES: &'static [u8] = &[$($code),*];

            /// The type a code on the wire names, if any.
            fn from_code(code: u8) -> Option<Kind> {
                match code {
                    $($code => Some(Kind::$kind),)*
                    _ => None,
                }
            }

            fn name(self) -> &'static str {
                match self {
                    $(Kind::$kind => $name,)*
                }
            }
        }

        impl Frame {
            fn kind(&self) -> Kind {
                match self {
                    $(Frame::$kind { .. } => Kind::$kind,)*
                }
            }

            /// Writes the payload as a peer of protocol `version` reads it.
            fn put_payload(&self, version: u16, out: &mut Writer) {
                match self {
                    $(Frame::$kind { $($field),* } => {
                        $(
                            if None::<u16>$(.or(Some($since)))?.map_or(true, |since: u16| version >= since) {
                                <$codec as Field>::put($field, out);
                            }
                        )*
                    })*
                }
            }

            /// Reads the payload of a frame of type `kind`.
            fn get_payload(kind: Kind, input: &mut Reader<'_>) -> Result<Frame, WireError> {
                match kind {
                    $(Kind::$kind => Ok(Frame::$kind {
                        $(
                            $field: read_field!($codec, input $(, $since)?),
                        )*
                    }),)*
                }
            }

            /// The layout of every frame as a Markdown table (type,
            /// direction, payload), as `docs/sessions.md` shows it; a test
            /// holds the two together.
            pub fn layout_table() -> String {
                let mut table = String::from("| type | direction | payload |\n|---|---|---|\n");
                $(
                    let fields: Vec<String> = vec![$(
                        describe(stringify!($field), &<$codec as Field>::layout(), None::<u16>$(.or(Some($since)))?),
                    )*];
                    let payload = match fields.is_empty() {
                        true => "(none)".to_owned(),
                        false => fields.join(", "),
                    };
                    table.push_str(&format!(
                        "| {} `{}` | {} | {payload} |\n",
                        $code,
                        stringify!($kind),
                        $direction,
                    ));
                )*
                table
            }
        }
    };
}

/// Reads one field; one a later version added is its default where the
/// frame ends before it.
macro_rules! read_field {
    ($codec:ty, $input:ident) => {
        <$codec as Field>::get($input)?
    };
    ($codec:ty, $input:ident, $since:expr) => {
        match $input.is_empty() {
            true => Default::default(),
            false => <$codec as Field>::get($input)?,
        }
    };
}

/// One field in the layout table: its name in words, its layout, and the
/// version that added it if it is not the first.
pub(super) fn describe(field: &str, layout: &str, since: Option<u16>) -> String {
    let name = field.replace('_', " ");
    match since {
        Some(version) => format!("{name} {layout} (from version {version})"),
        None => format!("{name} {layout}"),
    }
}

pub(super) use {frames, read_field};
