/* The VMM enters here in 64-bit mode with paging on (identity map) and rsp set. */
	.section .text.entry, "ax"
	.globl _start
_start:
	cld
	call	guest_main
1:	hlt
	jmp	1b

/* The interrupt handler for the MSI-X vector: count, EOI, return. */
	.globl	msix_isr
msix_isr:
	push	%rax
	lock incl	irq_count(%rip)
	movabs	$0xfee000b0, %rax	/* LAPIC EOI */
	movl	$0, (%rax)
	pop	%rax
	iretq
	.section .note.GNU-stack, "", @progbits
