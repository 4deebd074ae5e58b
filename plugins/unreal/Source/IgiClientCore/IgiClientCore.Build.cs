// IgiClientCore: the engine-independent C++17 client of the igi daemon (the same sources that
// plugins/unreal/CMakeLists.txt builds and tests outside Unreal). Only UnrealModule/ is UE-specific.
using System.IO;
using UnrealBuildTool;

public class IgiClientCore : ModuleRules
{
	public IgiClientCore(ReadOnlyTargetRules Target) : base(Target)
	{
		PCHUsage = PCHUsageMode.NoPCHs;
		CppStandard = CppStandardVersion.Cpp17;
		bEnableExceptions = true;   // the core reports errors as igi::IgiError exceptions
		bUseUnity = false;          // plain C++ sources with file-local helpers
		PublicIncludePaths.Add(Path.Combine(ModuleDirectory, "Public"));

		PublicDependencyModuleNames.Add("Core");   // IMPLEMENT_MODULE only
		PrivateDependencyModuleNames.Add("IgiZmq"); // libzmq + cppzmq (Source/ThirdParty/IgiZmq)
		// HMAC-SHA256 through the OpenSSL that ships with the engine (1.1.1 or 3.x: HMAC() exists in both).
		AddEngineThirdPartyPrivateStaticDependencies(Target, "OpenSSL");
	}
}
