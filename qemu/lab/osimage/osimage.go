// Package osimage builds the lab's "installed operating system": a disk image that proves, when firmware
// boots it, that it was installed, by printing a marker on the serial console. It has no dependencies so
// the lab machine's /init can build it in the guest.
//
// The image serves both firmware kinds from one MBR-partitioned disk:
//   - BIOS (SeaBIOS) runs the MBR's boot code, which writes the marker to COM1 and halts;
//   - UEFI (OVMF) finds the FAT16 EFI System Partition (MBR type 0xEF) and runs its removable-media
//     loader \EFI\BOOT\BOOTX64.EFI, a minimal PE32+ EFI application that prints the marker through
//     the console (which OVMF mirrors to the serial port) and halts.
//
// A Linux kernel or iPXE would boot too, but the kernel needs a command line to reach the serial console and
// iPXE would network boot again; the hand-made image needs nothing and cannot touch the network.
package osimage

import (
	"encoding/binary"
	"unicode/utf16"
)

// Layout of the image.
const (
	sectorSize = 512
	// espStart is the ESP's first sector (1 MiB aligned, as partitioning tools do).
	espStart = 2048
	// espSectors is the ESP's size: 8 MiB, enough clusters for FAT16.
	espSectors = 16384
	// Size is the image's length in bytes.
	Size = (espStart + espSectors) * sectorSize
)

// Build returns the disk image; marker is printed (ASCII) by both boot paths, followed by the firmware kind
// (" bios" or " uefi").
func Build(marker string) []byte {
	img := make([]byte, Size)

	copy(img, mbr(marker+" bios"))
	copy(img[espStart*sectorSize:], esp(efiApp(marker+" uefi")))

	return img
}

// mbr returns the master boot record: 16-bit boot code writing msg to COM1, and one partition entry, the ESP.
func mbr(msg string) []byte {
	b := make([]byte, sectorSize)

	// Real mode at 0000:7C00. Offsets are fixed, so the message's address is known: 0x7C00 + 22.
	code := []byte{
		0xFA,       // cli
		0x31, 0xC0, // xor ax, ax
		0x8E, 0xD8, // mov ds, ax
		0xBE, 0x16, 0x7C, // mov si, 0x7C16 (msg)
		0xBA, 0xF8, 0x03, // mov dx, 0x3F8 (COM1 data)
		0xAC,       // loop: lodsb
		0x84, 0xC0, // test al, al
		0x74, 0x03, // jz done
		0xEE,       // out dx, al
		0xEB, 0xF8, // jmp loop
		0xF4,       // done: hlt
		0xEB, 0xFD, // jmp done
	}
	copy(b, code)
	copy(b[len(code):], "\r\n"+msg+"\r\n\x00")

	// Partition entry 1 (offset 446): not active, type 0xEF (EFI System), LBA start and length.
	p := b[446:462]
	p[1], p[2], p[3] = 0xFE, 0xFF, 0xFF // CHS: use LBA
	p[4] = 0xEF
	p[5], p[6], p[7] = 0xFE, 0xFF, 0xFF
	binary.LittleEndian.PutUint32(p[8:], espStart)
	binary.LittleEndian.PutUint32(p[12:], espSectors)

	b[510], b[511] = 0x55, 0xAA

	return b
}

// efiApp returns a PE32+ EFI application (x86-64) that prints msg with SystemTable->ConOut->OutputString and
// halts. It is position independent and has no relocations, so the firmware may load it anywhere.
func efiApp(msg string) []byte {
	const (
		fileAlign = 0x200
		textRVA   = 0x1000
	)

	// MS x64 ABI: RCX = ImageHandle, RDX = SystemTable.
	code := []byte{
		0x48, 0x83, 0xEC, 0x28, // sub rsp, 40 (shadow space, alignment)
		0x48, 0x8B, 0x4A, 0x40, // mov rcx, [rdx+64] (SystemTable->ConOut)
		0x48, 0x8D, 0x15, 0, 0, 0, 0, // lea rdx, [rip+msg] (patched below)
		0xFF, 0x51, 0x08, // call [rcx+8] (ConOut->OutputString(This, String))
		0xF4,       // hang: hlt
		0xEB, 0xFD, // jmp hang
	}
	binary.LittleEndian.PutUint32(code[11:], uint32(len(code)-15)) // msg follows the code; rip is after the lea

	text := append([]byte{}, code...)
	for _, r := range utf16.Encode([]rune("\r\n" + msg + "\r\n\x00")) {
		text = binary.LittleEndian.AppendUint16(text, r)
	}

	rawSize := (len(text) + fileAlign - 1) / fileAlign * fileAlign
	img := make([]byte, fileAlign+rawSize)

	// DOS header: "MZ" and e_lfanew.
	copy(img, "MZ")
	binary.LittleEndian.PutUint32(img[0x3C:], 0x40)

	le := binary.LittleEndian
	h := img[0x40:]
	copy(h, "PE\x00\x00")

	// COFF file header.
	le.PutUint16(h[4:], 0x8664) // AMD64
	le.PutUint16(h[6:], 1)      // sections
	le.PutUint16(h[20:], 240)   // size of the optional header
	le.PutUint16(h[22:], 0x22)  // executable image, large address aware

	// Optional header (PE32+).
	o := h[24:]
	le.PutUint16(o[0:], 0x20B)
	le.PutUint32(o[4:], uint32(rawSize)) // size of code
	le.PutUint32(o[16:], textRVA)        // entry point
	le.PutUint32(o[20:], textRVA)        // base of code
	le.PutUint64(o[24:], 0x10000000)     // image base (any: no absolute addresses)
	le.PutUint32(o[32:], 0x1000)         // section alignment
	le.PutUint32(o[36:], fileAlign)      // file alignment
	sizeOfImage := textRVA + (len(text)+0xFFF)/0x1000*0x1000
	le.PutUint32(o[56:], uint32(sizeOfImage))
	le.PutUint32(o[60:], fileAlign) // size of headers
	le.PutUint16(o[68:], 10)        // subsystem: EFI application
	le.PutUint64(o[72:], 0x10000)   // stack reserve
	le.PutUint64(o[80:], 0x10000)   // stack commit
	le.PutUint32(o[108:], 16)       // number of data directories (all empty)

	// Section header: .text.
	s := o[240:]
	copy(s, ".text")
	le.PutUint32(s[8:], uint32(len(text))) // virtual size
	le.PutUint32(s[12:], textRVA)
	le.PutUint32(s[16:], uint32(rawSize))
	le.PutUint32(s[20:], fileAlign)
	le.PutUint32(s[36:], 0x60000020) // code, execute, read

	copy(img[fileAlign:], text)

	return img
}

// esp returns a FAT16 file system of espSectors sectors holding \EFI\BOOT\BOOTX64.EFI = loader.
func esp(loader []byte) []byte {
	const (
		reserved   = 1
		fats       = 2
		fatSectors = 64
		rootEnts   = 512
		rootSecs   = rootEnts * 32 / sectorSize
		dataStart  = reserved + fats*fatSectors + rootSecs
	)

	le := binary.LittleEndian
	fs := make([]byte, espSectors*sectorSize)

	// Boot sector with the BIOS parameter block.
	bs := fs[:sectorSize]
	copy(bs, []byte{0xEB, 0x3C, 0x90})
	copy(bs[3:], "OUTPOST ")
	le.PutUint16(bs[11:], sectorSize)
	bs[13] = 1 // sectors per cluster
	le.PutUint16(bs[14:], reserved)
	bs[16] = fats
	le.PutUint16(bs[17:], rootEnts)
	le.PutUint16(bs[19:], espSectors)
	bs[21] = 0xF8
	le.PutUint16(bs[22:], fatSectors)
	le.PutUint16(bs[24:], 32) // sectors per track
	le.PutUint16(bs[26:], 64) // heads
	le.PutUint32(bs[28:], espStart)
	bs[36] = 0x80
	bs[38] = 0x29
	le.PutUint32(bs[39:], 0x0B570057)
	copy(bs[43:], "OUTPOST ESP")
	copy(bs[54:], "FAT16   ")
	bs[510], bs[511] = 0x55, 0xAA

	clusterAt := func(c int) []byte {
		off := (dataStart + c - 2) * sectorSize

		return fs[off : off+sectorSize]
	}

	fat := make([]uint16, fatSectors*sectorSize/2)
	fat[0], fat[1] = 0xFFF8, 0xFFFF

	entry := func(dir []byte, i int, name string, attr byte, cluster int, size int) {
		e := dir[i*32 : i*32+32]
		copy(e, name)
		e[11] = attr
		le.PutUint16(e[26:], uint16(cluster))
		le.PutUint32(e[28:], uint32(size))
	}

	root := fs[(reserved+fats*fatSectors)*sectorSize:]

	const attrDir, attrFile = 0x10, 0x20

	// Clusters: 2 = \EFI, 3 = \EFI\BOOT, 4.. = the loader.
	entry(root, 0, "EFI        ", attrDir, 2, 0)
	fat[2], fat[3] = 0xFFFF, 0xFFFF
	entry(clusterAt(2), 0, ".          ", attrDir, 2, 0)
	entry(clusterAt(2), 1, "..         ", attrDir, 0, 0)
	entry(clusterAt(2), 2, "BOOT       ", attrDir, 3, 0)
	entry(clusterAt(3), 0, ".          ", attrDir, 3, 0)
	entry(clusterAt(3), 1, "..         ", attrDir, 2, 0)
	entry(clusterAt(3), 2, "BOOTX64 EFI", attrFile, 4, len(loader))

	n := (len(loader) + sectorSize - 1) / sectorSize
	for i := range n {
		c := 4 + i
		copy(clusterAt(c), loader[i*sectorSize:min(len(loader), (i+1)*sectorSize)])

		fat[c] = uint16(c + 1)
		if i == n-1 {
			fat[c] = 0xFFFF
		}
	}

	for f := range fats {
		off := (reserved + f*fatSectors) * sectorSize
		for i, v := range fat {
			le.PutUint16(fs[off+2*i:], v)
		}
	}

	return fs
}
