//! Reading an agent's JSON into typed structs where a field of an unexpected type reads as
//! absent.
//!
//! An agent's line is read in one pass straight into the reader's own structs: strings are
//! borrowed from the line where they hold no escapes, and a field the reader does not name is
//! skipped without being built (no `serde_json::Value` tree, no map per object). What an agent
//! prints is never trusted to have the shape its documentation gives, and one odd field must
//! not make a whole line unreadable: these helpers read any JSON value and keep it only when it
//! is of the type asked for, as walking a `Value` with `as_str` / `as_bool` / `as_u64` would.
//!
//! Use them as `#[serde(default, deserialize_with = "lenient::string")]` on an
//! `Option<Cow<'a, str>>` field (with `borrow` so that it borrows), [`Obj`] for a nested
//! object and [`StrOrSeq`] for a field that is a string or an array.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{value::MapAccessDeserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// Any JSON value, reduced to the scalar kinds the helpers keep.
enum Scalar<'de> {
    Str(Cow<'de, str>),
    Bool(bool),
    /// A non-negative integer (what `Value::as_u64` gives: no float, no negative number).
    Uint(u64),
    /// `null`, a float, a negative number, an array or an object.
    Other,
}

impl<'de> Deserialize<'de> for Scalar<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ScalarVisitor)
    }
}

struct ScalarVisitor;

impl<'de> Visitor<'de> for ScalarVisitor {
    type Value = Scalar<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Scalar::Str(Cow::Borrowed(v)))
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Scalar::Str(Cow::Owned(v.to_owned())))
    }

    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(Scalar::Str(Cow::Owned(v)))
    }

    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(Scalar::Bool(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Scalar::Uint(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(u64::try_from(v).map_or(Scalar::Other, Scalar::Uint))
    }

    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Scalar::Other)
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Scalar::Other)
    }

    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(Scalar::Other)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        Scalar::deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Scalar::Other)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Scalar::Other)
    }
}

/// A string field: `Some` for a JSON string, `None` for any other value.
pub(crate) fn string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Cow<'de, str>>, D::Error> {
    Ok(match Scalar::deserialize(d)? {
        Scalar::Str(s) => Some(s),
        _ => None,
    })
}

/// A field whose presence matters: `Some` of its text for a JSON string, `Some("")` for any
/// other value (`null` included); absent, the field's default (`None`).
pub(crate) fn present_string<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Cow<'de, str>>, D::Error> {
    Ok(Some(match Scalar::deserialize(d)? {
        Scalar::Str(s) => s,
        _ => Cow::Borrowed(""),
    }))
}

/// A boolean field: `Some` for `true` or `false`, `None` for any other value.
pub(crate) fn boolean<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    Ok(match Scalar::deserialize(d)? {
        Scalar::Bool(b) => Some(b),
        _ => None,
    })
}

/// A count: `Some` for a non-negative integer, `None` for any other value.
pub(crate) fn uint<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Ok(match Scalar::deserialize(d)? {
        Scalar::Uint(n) => Some(n),
        _ => None,
    })
}

/// A JSON object read as `T`; any other value (an array, a string, `null`, …) reads as
/// `Obj(None)`, and so does an absent field (`#[serde(default)]`).
///
/// `T` reads the object's members in the same pass (no `Value` in between); a `T` whose own
/// fields are lenient never fails, so neither does an `Obj<T>`. Unlike a derived struct, it
/// never takes an array for an object (serde reads a struct from an array by position).
#[derive(Debug)]
pub(crate) struct Obj<T>(pub Option<T>);

impl<T> Default for Obj<T> {
    fn default() -> Self {
        Obj(None)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Obj<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ObjVisitor<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjVisitor<T> {
            type Value = Obj<T>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map)).map(|t| Obj(Some(t)))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                ScalarVisitor.visit_seq(seq).map(|_| Obj(None))
            }

            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                Obj::deserialize(d)
            }

            fn visit_borrowed_str<E>(self, _: &'de str) -> Result<Self::Value, E> {
                Ok(Obj(None))
            }

            fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
                Ok(Obj(None))
            }

            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Obj(None))
            }

            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                Ok(Obj(None))
            }

            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Obj(None))
            }

            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Obj(None))
            }

            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(Obj(None))
            }

            fn visit_none<E>(self) -> Result<Self::Value, E> {
                Ok(Obj(None))
            }
        }

        d.deserialize_any(ObjVisitor(PhantomData))
    }
}

/// A value that may be a string or an array: a string is borrowed from the input where it has
/// no escapes, an array's elements are read as `T` in the same pass, and anything else (rare:
/// what a reader shows as JSON or refuses) is kept as a [`Value`]. An absent field reads as
/// `Other(Null)`.
#[derive(Debug)]
pub(crate) enum StrOrSeq<'a, T> {
    Str(Cow<'a, str>),
    Seq(Vec<T>),
    Other(Value),
}

impl<T> Default for StrOrSeq<'_, T> {
    fn default() -> Self {
        StrOrSeq::Other(Value::Null)
    }
}

impl<'de: 'a, 'a, T: Deserialize<'de>> Deserialize<'de> for StrOrSeq<'a, T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct StrOrSeqVisitor<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for StrOrSeqVisitor<T> {
            type Value = StrOrSeq<'de, T>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }

            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(StrOrSeq::Str(Cow::Borrowed(v)))
            }

            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(StrOrSeq::Str(Cow::Owned(v.to_owned())))
            }

            fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                Ok(StrOrSeq::Str(Cow::Owned(v)))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(16));
                while let Some(item) = seq.next_element::<T>()? {
                    items.push(item);
                }
                Ok(StrOrSeq::Seq(items))
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                Value::deserialize(MapAccessDeserializer::new(map)).map(StrOrSeq::Other)
            }

            fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
                Ok(StrOrSeq::Other(Value::from(v)))
            }

            fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
                Ok(StrOrSeq::Other(Value::from(v)))
            }

            fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
                Ok(StrOrSeq::Other(Value::from(v)))
            }

            fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
                Ok(StrOrSeq::Other(Value::from(v)))
            }

            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(StrOrSeq::Other(Value::Null))
            }

            fn visit_none<E>(self) -> Result<Self::Value, E> {
                Ok(StrOrSeq::Other(Value::Null))
            }

            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                StrOrSeq::deserialize(d)
            }
        }

        d.deserialize_any(StrOrSeqVisitor(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize, Default)]
    struct Probe<'a> {
        #[serde(default, borrow, deserialize_with = "string")]
        s: Option<Cow<'a, str>>,
        #[serde(default, borrow, deserialize_with = "present_string")]
        p: Option<Cow<'a, str>>,
        #[serde(default, deserialize_with = "boolean")]
        b: Option<bool>,
        #[serde(default, deserialize_with = "uint")]
        n: Option<u64>,
        #[serde(default, borrow)]
        o: Obj<Box<Probe<'a>>>,
    }

    fn read(json: &str) -> Probe<'_> {
        serde_json::from_str::<Obj<Probe>>(json)
            .unwrap()
            .0
            .unwrap_or_default()
    }

    #[test]
    fn a_field_of_the_asked_type_is_kept_and_borrowed() {
        let p = read(r#"{"s":"x","p":"y","b":true,"n":7,"o":{"s":"inner"},"other":[1,{"a":2}]}"#);
        assert!(matches!(p.s, Some(Cow::Borrowed("x"))));
        assert_eq!(p.p.as_deref(), Some("y"));
        assert_eq!((p.b, p.n), (Some(true), Some(7)));
        assert_eq!(p.o.0.unwrap().s.as_deref(), Some("inner"));
        // A string with an escape cannot be borrowed; it is still read.
        assert_eq!(read(r#"{"s":"a\nb"}"#).s.as_deref(), Some("a\nb"));
    }

    #[test]
    fn a_field_of_another_type_reads_as_absent_and_the_rest_still_reads() {
        for odd in [
            "1",
            "-1",
            "1.5",
            "null",
            "[1,[2]]",
            r#"{"x":{"y":1}}"#,
            "true",
        ] {
            let json =
                format!(r#"{{"s":{odd},"b":{odd},"o":{odd},"n":{odd},"p":{odd},"after":"x"}}"#);
            let p = read(&json);
            assert_eq!(p.s, None, "{json}");
            assert_eq!(p.p.as_deref(), Some(""), "present, not a string: {json}");
            assert!(p.o.0.is_none() || odd.starts_with('{'), "{json}");
            assert!(p.b.is_none() || odd == "true", "{json}");
            assert!(p.n.is_none() || odd == "1", "{json}");
        }
        // Absent: the default, and `present_string` says it was not there.
        let p = read("{}");
        assert_eq!((p.s, p.p, p.b, p.n), (None, None, None, None));
        // Negative numbers and floats are no count (as `Value::as_u64`).
        assert_eq!(read(r#"{"n":-3}"#).n, None);
        assert_eq!(read(r#"{"n":3.0}"#).n, None);
    }

    #[test]
    fn an_array_is_never_taken_for_an_object() {
        assert!(serde_json::from_str::<Obj<Probe>>(r#"["x","y"]"#)
            .unwrap()
            .0
            .is_none());
        assert!(serde_json::from_str::<Obj<Probe>>(r#""x""#)
            .unwrap()
            .0
            .is_none());
        // Malformed JSON is still an error: the line is not JSON at all.
        assert!(serde_json::from_str::<Obj<Probe>>(r#"{"s":"#).is_err());
    }
}
