/* Freestanding stand-in for <linux/types.h>, so the guest ABI header builds here. */
#ifndef SHIM_LINUX_TYPES_H
#define SHIM_LINUX_TYPES_H
typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef __u16 __le16;
typedef __u32 __le32;
typedef __u64 __le64;
#endif
