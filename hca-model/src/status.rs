//! The two ways a guest's request can fail, each its own type, whose values are the ABI's
//! codes, here and only here: a command's status in the mailbox ([`CmdError`]), and a work
//! request's completion status in its CQE ([`WcError`], ib_wc_status numbering).

use crate::abi::*;

/// Why a command failed. The discriminants are the codes (so that even an `as` cast gives
/// the right one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum CmdError {
    BadOpcode = CMD_BAD_OPCODE,
    BadParam = CMD_BAD_PARAM,
    BadHandle = CMD_BAD_HANDLE,
    BadState = CMD_BAD_STATE,
    Busy = CMD_BUSY,
    NoResources = CMD_NO_RESOURCES,
    BadAddress = CMD_BAD_ADDRESS,
}

impl CmdError {
    /// The mailbox status code (`HCA_CMD_*`).
    pub const fn code(self) -> u32 {
        self as u32
    }
}

/// Why a work request completed in error. The discriminants are the codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum WcError {
    LocLen = WC_LOC_LEN_ERR,
    LocQpOp = WC_LOC_QP_OP_ERR,
    LocProt = WC_LOC_PROT_ERR,
    WrFlush = WC_WR_FLUSH_ERR,
    MwBind = WC_MW_BIND_ERR,
    BadResp = WC_BAD_RESP_ERR,
    LocAccess = WC_LOC_ACCESS_ERR,
    RemInvReq = WC_REM_INV_REQ_ERR,
    RemAccess = WC_REM_ACCESS_ERR,
    RemOp = WC_REM_OP_ERR,
    RetryExc = WC_RETRY_EXC_ERR,
    RnrRetryExc = WC_RNR_RETRY_EXC_ERR,
    General = WC_GENERAL_ERR,
}

impl WcError {
    /// The CQE status code (`HCA_WC_*`, ib_wc_status numbering).
    pub const fn code(self) -> u32 {
        self as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_every_status_has_its_own_nonzero_code() {
        let cmd = [
            CmdError::BadOpcode,
            CmdError::BadParam,
            CmdError::BadHandle,
            CmdError::BadState,
            CmdError::Busy,
            CmdError::NoResources,
            CmdError::BadAddress,
        ]
        .map(CmdError::code);
        let wc = [
            WcError::LocLen,
            WcError::LocQpOp,
            WcError::LocProt,
            WcError::WrFlush,
            WcError::MwBind,
            WcError::BadResp,
            WcError::LocAccess,
            WcError::RemInvReq,
            WcError::RemAccess,
            WcError::RemOp,
            WcError::RetryExc,
            WcError::RnrRetryExc,
            WcError::General,
        ]
        .map(WcError::code);
        for codes in [&cmd[..], &wc[..]] {
            let set: std::collections::BTreeSet<u32> = codes.iter().copied().collect();
            assert_eq!(set.len(), codes.len());
            assert!(!set.contains(&0), "0 is success");
        }
    }
}
