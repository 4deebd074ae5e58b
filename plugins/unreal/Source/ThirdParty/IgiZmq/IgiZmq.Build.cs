// IgiZmq: prebuilt libzmq (4.3.2 or later) and the header-only cppzmq, one folder per platform.
//
//   include/zmq.h, include/zmq.hpp                  from libzmq and cppzmq (cppzmq >= 4.8)
//   lib/Win64/libzmq-v143-mt-4_3_5.lib + .dll        official Windows release (MSVC v143)
//   lib/Linux/libzmq.a                               built with -fPIC, -DWITH_LIBSODIUM=OFF -DENABLE_CURVE=OFF
//   lib/Mac/libzmq.a                                 same, universal (arm64 + x86_64)
// See docs/unreal.md ("Third-party libraries").
using System.IO;
using UnrealBuildTool;

public class IgiZmq : ModuleRules
{
	public IgiZmq(ReadOnlyTargetRules Target) : base(Target)
	{
		Type = ModuleType.External;
		PublicSystemIncludePaths.Add(Path.Combine(ModuleDirectory, "include"));
		string LibDir = Path.Combine(ModuleDirectory, "lib", Target.Platform.ToString());

		if (Target.Platform == UnrealTargetPlatform.Win64)
		{
			const string Dll = "libzmq-v143-mt-4_3_5.dll";
			PublicAdditionalLibraries.Add(Path.Combine(LibDir, "libzmq-v143-mt-4_3_5.lib"));
			RuntimeDependencies.Add(Path.Combine("$(BinaryOutputDir)", Dll), Path.Combine(LibDir, Dll));
		}
		else if (Target.Platform == UnrealTargetPlatform.Linux || Target.Platform == UnrealTargetPlatform.Mac)
		{
			PublicDefinitions.Add("ZMQ_STATIC=1");
			PublicAdditionalLibraries.Add(Path.Combine(LibDir, "libzmq.a"));
		}
	}
}
