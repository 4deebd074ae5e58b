// IgiRuntime: the thin Unreal wrapper (UIgiSubsystem, UIgiNpcComponent) over IgiClientCore.
using System.IO;
using UnrealBuildTool;

public class IgiRuntime : ModuleRules
{
	public IgiRuntime(ReadOnlyTargetRules Target) : base(Target)
	{
		PCHUsage = PCHUsageMode.UseExplicitOrSharedPCHs;
		CppStandard = CppStandardVersion.Cpp17;
		bEnableExceptions = true;   // catches igi::IgiError thrown by blocking core calls
		PublicDependencyModuleNames.AddRange(new string[] { "Core", "CoreUObject", "Engine", "Json", "IgiClientCore" });
		PrivateDependencyModuleNames.Add("Projects");  // IPluginManager: where the staged daemon bundle is
		// GGameThreadTime, GRenderThreadTime, RHIGetGPUFrameCycles: the frame's busy time for the budget helper.
		PrivateDependencyModuleNames.AddRange(new string[] { "RenderCore", "RHI" });
		// PNG/JPEG encoding of captures (IgiImageCapture).
		PrivateDependencyModuleNames.AddRange(new string[] { "ImageWrapper" });
		// IgiClientCore links libzmq (IgiZmq) and the engine's OpenSSL; nothing else is needed here.

		// The self-contained daemon bundle (./dev.sh bundle, docs/bundle.md), copied to
		// Binaries/IgiDaemon/<Platform>/igi-daemon/, is staged with a packaged game as loose files (NonUFS: an
		// executable cannot run from a pak), so UIgiSubsystem::LaunchDaemon("") finds it beside the plugin.
		string Platform = Target.Platform.ToString();
		PrivateDefinitions.Add("IGI_DAEMON_PLATFORM=\"" + Platform + "\"");
		string BundleDir = Path.Combine(PluginDirectory, "Binaries", "IgiDaemon", Platform, "igi-daemon");
		if (Directory.Exists(BundleDir))
		{
			foreach (string File in Directory.EnumerateFiles(BundleDir, "*", SearchOption.AllDirectories))
			{
				RuntimeDependencies.Add(File, StagedFileType.NonUFS);
			}
		}
	}
}
