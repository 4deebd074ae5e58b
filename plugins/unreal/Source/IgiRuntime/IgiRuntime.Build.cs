// IgiRuntime: the thin Unreal wrapper (UIgiSubsystem, UIgiNpcComponent) over IgiClientCore.
using UnrealBuildTool;

public class IgiRuntime : ModuleRules
{
	public IgiRuntime(ReadOnlyTargetRules Target) : base(Target)
	{
		PCHUsage = PCHUsageMode.UseExplicitOrSharedPCHs;
		CppStandard = CppStandardVersion.Cpp17;
		bEnableExceptions = true;   // catches igi::IgiError thrown by blocking core calls
		PublicDependencyModuleNames.AddRange(new string[] { "Core", "CoreUObject", "Engine", "IgiClientCore" });
		// IgiClientCore links libzmq (IgiZmq) and the engine's OpenSSL; nothing else is needed here.
	}
}
