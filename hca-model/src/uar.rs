//! Where a queue's doorbell record lives. Kernel queues use the record BAR2 keeps for their
//! handle; a user process's queues name one in its user access region (UAR), a BAR2 page
//! its kernel maps into that process alone, so that the process can move only its own
//! queues' producer indices, arm words and consumer indices.

use crate::abi::{BAR2_SIZE, BAR2_UAR_OFFSET};
use crate::status::CmdError;

/// The record a CREATE_* command asked for: `default` (the handle's record) when
/// `db_offset` is 0, else an 8-byte aligned record inside the user access regions.
pub(crate) fn record(db_offset: u32, default: u32) -> Result<u32, CmdError> {
    if db_offset == 0 {
        return Ok(default);
    }
    let inside = (BAR2_UAR_OFFSET..=BAR2_SIZE - 8).contains(&db_offset);
    if !inside || db_offset % 8 != 0 {
        return Err(CmdError::BadParam);
    }
    Ok(db_offset)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::{BAR2_QP_DB_OFFSET, UAR_SIZE};

    #[test]
    fn test_records_stay_in_the_user_access_regions_and_aligned() {
        assert_eq!(record(0, BAR2_QP_DB_OFFSET + 8), Ok(BAR2_QP_DB_OFFSET + 8));
        assert_eq!(record(BAR2_UAR_OFFSET, 0), Ok(BAR2_UAR_OFFSET));
        assert_eq!(record(BAR2_SIZE - 8, 0), Ok(BAR2_SIZE - 8));
        assert_eq!(
            record(BAR2_UAR_OFFSET + UAR_SIZE + 0x808, 0),
            Ok(BAR2_UAR_OFFSET + UAR_SIZE + 0x808)
        );
        for bad in [
            8,
            BAR2_QP_DB_OFFSET,
            BAR2_UAR_OFFSET - 8,
            BAR2_UAR_OFFSET + 4,
            BAR2_SIZE - 4,
            BAR2_SIZE,
            !7,
        ] {
            assert_eq!(record(bad, 0), Err(CmdError::BadParam), "{bad:#x}");
        }
    }
}
