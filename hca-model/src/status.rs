//! The two ways a guest's request can fail, each its own type, whose values are the ABI's
//! codes, here and only here: a command's status in the mailbox ([`CmdError`]), and a work
//! request's completion status in its CQE ([`WcError`], ib_wc_status numbering).

use crate::abi::*;

/// Why a command failed. The discriminants are the codes (so that even an `as` cast gives
/// the right one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum CmdError {
    /// No command has this opcode (`CMD_BAD_OPCODE`).
    BadOpcode = CMD_BAD_OPCODE,
    /// An input field is out of range or inconsistent (`CMD_BAD_PARAM`).
    BadParam = CMD_BAD_PARAM,
    /// A handle names nothing live (`CMD_BAD_HANDLE`).
    BadHandle = CMD_BAD_HANDLE,
    /// The object's state forbids the command (`CMD_BAD_STATE`).
    BadState = CMD_BAD_STATE,
    /// The object is still in use (`CMD_BUSY`).
    Busy = CMD_BUSY,
    /// A table or the page budget is full (`CMD_NO_RESOURCES`).
    NoResources = CMD_NO_RESOURCES,
    /// A guest address is outside guest memory or misaligned (`CMD_BAD_ADDRESS`).
    BadAddress = CMD_BAD_ADDRESS,
    /// The device is in a catastrophic error and runs only teardown (`CMD_FATAL`).
    Fatal = CMD_FATAL,
    /// An SMP's M_Key does not match the port's (`CMD_BAD_KEY`).
    BadKey = CMD_BAD_KEY,
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
    /// Local length error (`WC_LOC_LEN_ERR`).
    LocLen = WC_LOC_LEN_ERR,
    /// Local QP operation error (`WC_LOC_QP_OP_ERR`).
    LocQpOp = WC_LOC_QP_OP_ERR,
    /// Local protection error (`WC_LOC_PROT_ERR`).
    LocProt = WC_LOC_PROT_ERR,
    /// Flushed: the QP was in error (`WC_WR_FLUSH_ERR`).
    WrFlush = WC_WR_FLUSH_ERR,
    /// A memory window bind failed (`WC_MW_BIND_ERR`).
    MwBind = WC_MW_BIND_ERR,
    /// Bad response (`WC_BAD_RESP_ERR`).
    BadResp = WC_BAD_RESP_ERR,
    /// Local access error (`WC_LOC_ACCESS_ERR`).
    LocAccess = WC_LOC_ACCESS_ERR,
    /// The peer found the request invalid (`WC_REM_INV_REQ_ERR`).
    RemInvReq = WC_REM_INV_REQ_ERR,
    /// The peer refused the access (`WC_REM_ACCESS_ERR`).
    RemAccess = WC_REM_ACCESS_ERR,
    /// The peer could not execute the request (`WC_REM_OP_ERR`).
    RemOp = WC_REM_OP_ERR,
    /// Retries ran out, or the peer's port is gone (`WC_RETRY_EXC_ERR`).
    RetryExc = WC_RETRY_EXC_ERR,
    /// RNR retries ran out (`WC_RNR_RETRY_EXC_ERR`).
    RnrRetryExc = WC_RNR_RETRY_EXC_ERR,
    /// Any other failure (`WC_GENERAL_ERR`).
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
