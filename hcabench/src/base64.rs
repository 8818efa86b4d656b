//! Base64 (RFC 4648, the standard alphabet, `=` padding), as busybox `base64` writes and
//! reads it: how `hcabench cp` carries file bytes over a guest's serial line.

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Characters per line, as busybox and coreutils wrap.
pub const LINE: usize = 76;

/// `data` in base64, in lines of [`LINE`] characters, each ending in a newline.
pub fn encode_lines(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len() / 3 * 4 + data.len() / 57 + 8);
    // 57 bytes make one 76-character line.
    for line in data.chunks(LINE / 4 * 3) {
        for g in line.chunks(3) {
            let b = [
                g.first().copied().unwrap_or(0),
                g.get(1).copied().unwrap_or(0),
                g.get(2).copied().unwrap_or(0),
            ];
            let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
            for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
                if i <= g.len() {
                    out.push(char::from(ALPHABET[(n >> shift & 63) as usize]));
                } else {
                    out.push('=');
                }
            }
        }
        out.push('\n');
    }
    out
}

fn value(c: u8) -> Option<u32> {
    Some(u32::from(match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => return None,
    }))
}

/// What is wrong with a line that should be base64.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Base64Error {
    #[error("a base64 line of {0} characters")]
    Length(usize),
    #[error("base64 padding in the middle of a line")]
    Padding,
    #[error("{0:?} is not base64")]
    Char(char),
}

/// Decodes one line (no newline): whole groups of four, padding only at the end. Err says
/// what is wrong; a guest may send anything.
pub fn decode_line(line: &[u8], out: &mut Vec<u8>) -> Result<(), Base64Error> {
    if line.len() % 4 != 0 {
        return Err(Base64Error::Length(line.len()));
    }
    let groups = line.len() / 4;
    for (i, g) in line.chunks_exact(4).enumerate() {
        let pad = g.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && i + 1 != groups) {
            return Err(Base64Error::Padding);
        }
        let mut n = 0u32;
        for &c in g.iter().take(4 - pad) {
            n = n << 6 | value(c).ok_or(Base64Error::Char(char::from(c)))?;
        }
        n <<= 6 * pad as u32;
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(bytes.get(..3 - pad).unwrap_or_default());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_rfc_4648_examples_encode_and_decode() {
        for (plain, coded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            let want = if coded.is_empty() {
                String::new()
            } else {
                format!("{coded}\n")
            };
            assert_eq!(encode_lines(plain.as_bytes()), want);
            let mut out = Vec::new();
            decode_line(coded.as_bytes(), &mut out).unwrap();
            assert_eq!(out, plain.as_bytes());
        }
    }

    #[test]
    fn test_every_byte_value_survives_lines_of_76() {
        let data: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        let text = encode_lines(&data);
        let mut back = Vec::new();
        for line in text.lines() {
            assert!(line.len() <= LINE);
            decode_line(line.as_bytes(), &mut back).unwrap();
        }
        assert_eq!(back, data);
    }

    #[test]
    fn test_garbage_is_refused_not_decoded() {
        for bad in ["abc", "ab!d", "a=bc", "Zg==Zg==", "Z==="] {
            assert!(
                decode_line(bad.as_bytes(), &mut Vec::new()).is_err(),
                "{bad}"
            );
        }
    }
}
