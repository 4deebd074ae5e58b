// Layer: core/client. A file's POSIX permission bits, for the connection-file check of PROTOCOL.md section 13.
using System;
using System.IO;
using System.Reflection;
using System.Runtime.InteropServices;
using System.Text;

namespace Igi.Client
{
    /// <summary>
    /// Reads a file's POSIX permission bits without Mono.Posix (absent from Unity's profiles) and without .NET 7's
    /// <c>File.GetUnixFileMode</c> (absent from Mono), so that it compiles with Debian's mcs and in Unity alike.
    /// Order: <c>File.GetUnixFileMode</c> through reflection when the runtime has it; else libc through P/Invoke:
    /// <c>statx</c> on Linux (glibc 2.28+; its struct is the same on every architecture) and the 64-bit-inode
    /// <c>stat</c> on macOS. Windows, other systems, and a runtime where none of these resolves (e.g. no libc mapping)
    /// answer "unknown", never a guess.
    /// </summary>
    public static class PosixFileMode
    {
        private const int AtFdCwd = -100;        // AT_FDCWD: a relative path is relative to the working directory
        private const uint StatxMode = 0x2;      // STATX_MODE
        private const int StatxModeOffset = 28;  // struct statx: u32 mask, u32 blksize, u64 attributes, u32 nlink, uid, gid, u16 mode
        private const int DarwinModeOffset = 4;  // struct stat (64-bit inode): i32 st_dev, u16 st_mode
        private const int FileTypeMask = 0xF000; // S_IFMT
        private const int RegularFile = 0x8000;  // S_IFREG

        [DllImport("libc", EntryPoint = "uname")]
        private static extern int uname([Out] byte[] buf);

        [DllImport("libc", EntryPoint = "statx")]
        private static extern int statx(int dirfd, [MarshalAs(UnmanagedType.LPStr)] string path, int flags, uint mask, [Out] byte[] buf);

        [DllImport("libc", EntryPoint = "stat$INODE64")]
        private static extern int stat_inode64([MarshalAs(UnmanagedType.LPStr)] string path, [Out] byte[] buf);

        [DllImport("libc", EntryPoint = "stat")]
        private static extern int stat_darwin_arm64([MarshalAs(UnmanagedType.LPStr)] string path, [Out] byte[] buf);

        /// <summary>True on Linux, macOS and other Unix-like systems (where a file has owner/group/other bits).</summary>
        public static bool IsPosix
        {
            get
            {
                PlatformID p = Environment.OSVersion.Platform;
                return p == PlatformID.Unix || p == PlatformID.MacOSX;
            }
        }

        /// <summary>
        /// The permission bits (<c>mode &amp; 07777</c>, e.g. <c>0x180</c> = octal 600) of the file at
        /// <paramref name="path"/>, following symbolic links like stat(2). False when they cannot be known: not POSIX,
        /// no way to ask the system, the file is missing or not a regular file.
        /// </summary>
        public static bool TryGetPermissions(string path, out int permissions)
        {
            permissions = 0;
            if (string.IsNullOrEmpty(path) || !IsPosix) return false;
            bool known;
            if (TryGetUnixFileMode(path, out known, out permissions)) return true;
            if (known) return false;  // .NET 7+ answered: the file is missing or unreadable
            try
            {
                return TryLibc(path, out permissions);
            }
            catch (DllNotFoundException) { }        // no "libc" mapping (e.g. some IL2CPP players)
            catch (EntryPointNotFoundException) { } // glibc before 2.28 (no statx), or a libc without these names
            permissions = 0;
            return false;
        }

        // .NET 7+: System.IO.File.GetUnixFileMode(string). `known` is false when the runtime has no such method.
        private static bool TryGetUnixFileMode(string path, out bool known, out int permissions)
        {
            permissions = 0;
            MethodInfo method = typeof(File).GetMethod("GetUnixFileMode", BindingFlags.Public | BindingFlags.Static, null,
                                                       new[] { typeof(string) }, null);
            known = method != null;
            if (method == null) return false;
            if (!File.Exists(path)) return false;  // missing, or not a file (a directory has a mode too)
            try
            {
                permissions = Convert.ToInt32(method.Invoke(null, new object[] { path })) & 0xFFF;
                return true;
            }
            catch (TargetInvocationException)
            {
                return false;
            }
        }

        private static bool TryLibc(string path, out int permissions)
        {
            permissions = 0;
            var uts = new byte[4096];  // struct utsname: 6 x 65 bytes on Linux, 5 x 256 on macOS; sysname comes first
            if (uname(uts) != 0) return false;
            int end = Array.IndexOf(uts, (byte)0);
            string sysname = Encoding.ASCII.GetString(uts, 0, end < 0 ? 0 : end);
            var buf = new byte[512];  // struct statx is 256 bytes, struct stat on macOS 144
            int mode;
            if (sysname == "Linux")
            {
                if (statx(AtFdCwd, path, 0, StatxMode, buf) != 0) return false;
                if ((BitConverter.ToUInt32(buf, 0) & StatxMode) == 0) return false;  // stx_mask: the mode was not filled in
                mode = BitConverter.ToUInt16(buf, StatxModeOffset);
            }
            else if (sysname == "Darwin")
            {
                int rc;
                try { rc = stat_inode64(path, buf); }                      // x86_64: stat$INODE64 has the 64-bit-inode layout
                catch (EntryPointNotFoundException) { rc = stat_darwin_arm64(path, buf); }  // arm64: plain stat has it
                if (rc != 0) return false;
                mode = BitConverter.ToUInt16(buf, DarwinModeOffset);
            }
            else
            {
                return false;
            }
            if ((mode & FileTypeMask) != RegularFile) return false;  // not a regular file (or an unexpected layout)
            permissions = mode & 0xFFF;
            return true;
        }
    }
}
