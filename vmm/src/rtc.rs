//! The CMOS real-time clock (an MC146818 at I/O ports 0x70 and 0x71), which is where a PC
//! guest reads the wall-clock time at boot and where Linux's rtc_cmos driver binds (without
//! ACPI it registers the device unconditionally). With no RTC, the ports read 0xff: the
//! kernel reports "Unable to read current time from RTC", starts in 1970, and rtc_cmos
//! polls the "update in progress" bit until it gives up ("broken or not accessible").
//!
//! The time is the host's UTC plus an offset that the guest's writes to the time registers
//! set. An update is never in progress: every read computes the time afresh. Register B's
//! format bits are honoured (BCD or binary, 12- or 24-hour). The other 114 bytes are
//! NVRAM. No interrupt is raised (periodic, alarm and update interrupts are not emulated;
//! their enable bits are stored): Linux's RTC core emulates update events by polling.

use std::time::{SystemTime, UNIX_EPOCH};

pub const PORT_INDEX: u16 = 0x70;
pub const PORT_DATA: u16 = 0x71;

const SECONDS: u8 = 0x00;
const MINUTES: u8 = 0x02;
const HOURS: u8 = 0x04;
const WEEKDAY: u8 = 0x06;
const DAY: u8 = 0x07;
const MONTH: u8 = 0x08;
const YEAR: u8 = 0x09;
const REG_A: u8 = 0x0a;
const REG_B: u8 = 0x0b;
const REG_C: u8 = 0x0c;
const REG_D: u8 = 0x0d;
const CENTURY: u8 = 0x32;

/// Register A: the 32.768 kHz time base, 1024 Hz periodic rate, no update in progress.
const REG_A_DEFAULT: u8 = 0x26;
/// Register B: 24-hour mode, BCD.
const REG_B_24H: u8 = 0x02;
const REG_B_BINARY: u8 = 0x04;
/// Register D: valid RAM and time.
const REG_D_VRT: u8 = 0x80;
const HOUR_PM: u8 = 0x80;

/// The calendar fields of one second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DateTime {
    year: i64,
    month: u32,
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
}

/// Days since 1970-01-01 of a proleptic Gregorian date (eras of 400 years, March-based
/// years so that the leap day comes last).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (i64::from(month) + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

impl DateTime {
    fn from_unix(secs: i64) -> DateTime {
        let (year, month, day) = civil_from_days(secs.div_euclid(86_400));
        let s = secs.rem_euclid(86_400) as u32;
        DateTime {
            year,
            month,
            day,
            hour: s / 3600,
            minute: s / 60 % 60,
            second: s % 60,
        }
    }

    fn to_unix(self) -> i64 {
        days_from_civil(self.year, self.month, self.day) * 86_400
            + i64::from(self.hour * 3600 + self.minute * 60 + self.second)
    }

    /// 1 (Sunday) to 7, as the MC146818 counts.
    fn weekday(self) -> u8 {
        // 1970-01-01 was a Thursday.
        ((days_from_civil(self.year, self.month, self.day) + 4).rem_euclid(7) + 1) as u8
    }
}

pub struct Cmos {
    index: u8,
    ram: [u8; 128],
    /// Guest time minus host time, in seconds.
    offset: i64,
    clock: fn() -> i64,
}

fn host_unix_seconds() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

impl Default for Cmos {
    fn default() -> Self {
        Self::with_clock(host_unix_seconds)
    }
}

impl Cmos {
    /// An RTC on `clock` (seconds since the epoch; the host's clock in [`Cmos::default`]).
    fn with_clock(clock: fn() -> i64) -> Cmos {
        let mut cmos = Cmos {
            index: 0,
            ram: [0; 128],
            offset: 0,
            clock,
        };
        cmos.set_reg(REG_A, REG_A_DEFAULT);
        cmos.set_reg(REG_B, REG_B_24H);
        cmos.set_reg(REG_D, REG_D_VRT);
        cmos
    }

    /// CMOS byte `r` (the index port keeps it below 128).
    fn reg(&self, r: u8) -> u8 {
        self.ram.get(usize::from(r)).copied().unwrap_or(0)
    }

    fn set_reg(&mut self, r: u8, v: u8) {
        if let Some(b) = self.ram.get_mut(usize::from(r)) {
            *b = v;
        }
    }

    fn now(&self) -> DateTime {
        DateTime::from_unix((self.clock)() + self.offset)
    }

    fn binary(&self) -> bool {
        self.reg(REG_B) & REG_B_BINARY != 0
    }

    fn encode(&self, v: u32) -> u8 {
        let v = v as u8;
        if self.binary() {
            v
        } else {
            ((v / 10) << 4) | (v % 10)
        }
    }

    fn decode(&self, v: u8) -> u32 {
        if self.binary() {
            u32::from(v)
        } else {
            u32::from(v >> 4) * 10 + u32::from(v & 0xf)
        }
    }

    fn hours_out(&self, h: u32) -> u8 {
        if self.reg(REG_B) & REG_B_24H != 0 {
            return self.encode(h);
        }
        let h12 = if h % 12 == 0 { 12 } else { h % 12 };
        self.encode(h12) | if h >= 12 { HOUR_PM } else { 0 }
    }

    fn hours_in(&self, v: u8) -> u32 {
        if self.reg(REG_B) & REG_B_24H != 0 {
            return self.decode(v);
        }
        let h12 = self.decode(v & !HOUR_PM) % 12;
        h12 + if v & HOUR_PM != 0 { 12 } else { 0 }
    }

    fn read_register(&mut self, reg: u8) -> u8 {
        let t = self.now();
        match reg {
            SECONDS => self.encode(t.second),
            MINUTES => self.encode(t.minute),
            HOURS => self.hours_out(t.hour),
            WEEKDAY => self.encode(u32::from(t.weekday())),
            DAY => self.encode(t.day),
            MONTH => self.encode(t.month),
            YEAR => self.encode(t.year.rem_euclid(100) as u32),
            CENTURY => self.encode(t.year.div_euclid(100).clamp(0, 99) as u32),
            // Reading C acknowledges the (never raised) interrupt flags.
            REG_C => {
                let flags = self.reg(REG_C);
                self.set_reg(REG_C, 0);
                flags
            }
            _ => self.reg(reg),
        }
    }

    fn write_register(&mut self, reg: u8, v: u8) {
        let mut t = self.now();
        match reg {
            SECONDS => t.second = self.decode(v).min(59),
            MINUTES => t.minute = self.decode(v).min(59),
            HOURS => t.hour = self.hours_in(v).min(23),
            DAY => t.day = self.decode(v).clamp(1, 31),
            MONTH => t.month = self.decode(v).clamp(1, 12),
            YEAR => t.year = t.year.div_euclid(100) * 100 + i64::from(self.decode(v).min(99)),
            CENTURY => t.year = i64::from(self.decode(v).min(99)) * 100 + t.year.rem_euclid(100),
            // Derived from the date.
            WEEKDAY => return,
            // UIP and the flags are read-only; D's valid bit stays.
            REG_A => {
                self.set_reg(REG_A, v & 0x7f);
                return;
            }
            REG_C | REG_D => return,
            REG_B => {
                // SET freezes updates while the guest writes the time; writes above land
                // at once, so it is only stored.
                self.set_reg(REG_B, v);
                return;
            }
            _ => {
                self.set_reg(reg, v);
                return;
            }
        }
        self.offset = t.to_unix() - (self.clock)();
    }

    /// A guest read of `port` (0x70 reads back the index; 0x71 the indexed register).
    pub fn read(&mut self, port: u16) -> u8 {
        match port {
            PORT_DATA => self.read_register(self.index),
            _ => self.index,
        }
    }

    /// A guest write of `v` to `port`: 0x70 selects a register (bit 7 is the NMI mask,
    /// which has no effect here), 0x71 writes it.
    pub fn write(&mut self, port: u16, v: u8) {
        match port {
            PORT_INDEX => self.index = v & 0x7f,
            PORT_DATA => self.write_register(self.index, v),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // 2026-11-22 13:31:06 UTC, a Sunday.
    const NOW: i64 = 1_795_354_266;

    fn rtc() -> Cmos {
        Cmos::with_clock(|| NOW)
    }

    fn reg(c: &mut Cmos, r: u8) -> u8 {
        c.write(PORT_INDEX, r);
        c.read(PORT_DATA)
    }

    fn set(c: &mut Cmos, r: u8, v: u8) {
        c.write(PORT_INDEX, r);
        c.write(PORT_DATA, v);
    }

    #[test]
    fn test_time_reads_back_in_bcd_as_linux_expects_at_boot() {
        let mut c = rtc();
        assert_eq!(reg(&mut c, REG_A) & 0x80, 0, "no update in progress");
        assert_eq!(reg(&mut c, REG_D), REG_D_VRT, "valid time");
        let fields = [
            (SECONDS, 0x06),
            (MINUTES, 0x31),
            (HOURS, 0x13),
            (WEEKDAY, 0x01),
            (DAY, 0x22),
            (MONTH, 0x11),
            (YEAR, 0x26),
            (CENTURY, 0x20),
        ];
        for (r, want) in fields {
            assert_eq!(reg(&mut c, r), want, "register {r:#x}");
        }
        // The NMI-mask bit of the index port does not change the register.
        c.write(PORT_INDEX, 0x80 | MINUTES);
        assert_eq!(c.read(PORT_DATA), 0x31);
    }

    #[test]
    fn test_binary_and_12_hour_modes() {
        let mut c = rtc();
        set(&mut c, REG_B, REG_B_BINARY);
        assert_eq!(reg(&mut c, HOURS), 1 | HOUR_PM);
        assert_eq!(reg(&mut c, MINUTES), 31);
        set(&mut c, REG_B, REG_B_BINARY | REG_B_24H);
        assert_eq!(reg(&mut c, HOURS), 13);
    }

    #[test]
    fn test_guest_writes_move_its_clock_only() {
        let mut c = rtc();
        set(&mut c, YEAR, 0x30);
        set(&mut c, MONTH, 0x02);
        set(&mut c, DAY, 0x29);
        set(&mut c, HOURS, 0x23);
        assert_eq!(reg(&mut c, YEAR), 0x30);
        assert_eq!(
            reg(&mut c, MONTH),
            0x03,
            "2030 has no 29 February: it rolls over"
        );
        assert_eq!(reg(&mut c, DAY), 0x01);
        assert_eq!(reg(&mut c, HOURS), 0x23);
        assert_eq!(reg(&mut c, MINUTES), 0x31);
        // Another RTC on the same host clock is unaffected.
        assert_eq!(reg(&mut rtc(), YEAR), 0x26);
    }

    #[test]
    fn test_nvram_keeps_bytes_and_status_registers_stay_sane() {
        let mut c = rtc();
        set(&mut c, 0x40, 0xa5);
        assert_eq!(reg(&mut c, 0x40), 0xa5);
        set(&mut c, REG_A, 0xff);
        assert_eq!(reg(&mut c, REG_A) & 0x80, 0, "UIP is read-only");
        set(&mut c, REG_D, 0);
        assert_eq!(reg(&mut c, REG_D), REG_D_VRT);
        assert_eq!(reg(&mut c, REG_C), 0);
    }

    #[test]
    fn test_calendar_round_trips() {
        for secs in [0, 951_782_400, NOW, 4_107_542_399, -86_400] {
            let t = DateTime::from_unix(secs);
            assert_eq!(t.to_unix(), secs, "{t:?}");
        }
        // 2000-02-29 (a leap day in a century year divisible by 400).
        let t = DateTime::from_unix(951_782_400);
        assert_eq!((t.year, t.month, t.day), (2000, 2, 29));
        assert_eq!(
            DateTime::from_unix(0).weekday(),
            5,
            "1970-01-01 was a Thursday"
        );
    }
}
