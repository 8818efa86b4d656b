// SPDX-License-Identifier: GPL-2.0
/* vma->vm_flags is read-only; vm_flags_set() changes it (6.3+, some 6.1.y). */
#include <linux/mm.h>

void hcab_conftest(struct vm_area_struct *vma);
void hcab_conftest(struct vm_area_struct *vma)
{
	vm_flags_set(vma, VM_DONTEXPAND);
}
