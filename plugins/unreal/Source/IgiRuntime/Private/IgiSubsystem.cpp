// IgiSubsystem.cpp - IgiRuntime (Unreal wrapper): client lifetime, connection, per-frame pump.
#include "IgiSubsystem.h"

#include "IgiDaemonProcess.h"
#include "Interfaces/IPluginManager.h"
#include "HAL/FileManager.h"
#include "HAL/PlatformMisc.h"
#include "HAL/PlatformTime.h"
#include "Misc/CommandLine.h"
#include "Misc/Parse.h"
#include "Misc/Paths.h"
#include "RenderCore.h"  // GGameThreadTime, GRenderThreadTime
#include "RHI.h"         // RHIGetGPUFrameCycles

#include <utility>

namespace
{
FString Utf8(const std::string& S) { return FString(UTF8_TO_TCHAR(S.c_str())); }
}

void UIgiSubsystem::Initialize(FSubsystemCollectionBase& Collection)
{
	Super::Initialize(Collection);
	FString File;
	if (FParse::Value(FCommandLine::Get(), TEXT("IgiConnectionFile="), File) ||
		!FPlatformMisc::GetEnvironmentVariable(TEXT("IGI_CONNECTION_FILE")).IsEmpty())
	{
		ConnectWhenReady(File, 120.f);
	}
}

void UIgiSubsystem::Deinitialize()
{
	Connecting.reset();  // ends a handshake under way at once
	Driver.reset();  // forgets its in-flight requests before the client goes
	Budget.reset();
	if (Launcher)
	{
		// We started this daemon, so we stop it: shutdown_request (it cancels work, frees memory and exits), and a
		// kill if it has not exited within the stop timeout. Nothing of it is left running.
		Launcher->Stop(Client.get());
		Launcher->Pump();
		Launcher.reset();
	}
	if (Client)
	{
		Client->Close();
		Client.reset();
	}
	Super::Deinitialize();
}

TStatId UIgiSubsystem::GetStatId() const { RETURN_QUICK_DECLARE_CYCLE_STAT(UIgiSubsystem, STATGROUP_Tickables); }

FString UIgiSubsystem::DefaultConnectionFile()
{
	FString File;
	if (FParse::Value(FCommandLine::Get(), TEXT("IgiConnectionFile="), File)) return File;
	File = FPlatformMisc::GetEnvironmentVariable(TEXT("IGI_CONNECTION_FILE"));
	if (!File.IsEmpty()) return File;
	return FPaths::Combine(FPaths::ProjectSavedDir(), TEXT("Igi"), TEXT("connection.json"));
}

FString UIgiSubsystem::DefaultDaemonExecutable()
{
	FString Base = FPaths::ProjectPluginsDir() / TEXT("IgiPlugin");
	if (TSharedPtr<IPlugin> Plugin = IPluginManager::Get().FindPlugin(TEXT("IgiPlugin"))) Base = Plugin->GetBaseDir();
	// IGI_DAEMON_PLATFORM is the UBT platform name (Win64, Linux, Mac), set by IgiRuntime.Build.cs.
	const FString Folder = FPaths::Combine(Base, TEXT("Binaries"), TEXT("IgiDaemon"), TEXT(IGI_DAEMON_PLATFORM), TEXT("igi-daemon"));
	return FPaths::ConvertRelativePathToFull(UTF8_TO_TCHAR(igi::BundleExecutable(TCHAR_TO_UTF8(*Folder)).c_str()));
}

bool UIgiSubsystem::LaunchDaemon(const FString& Executable, const FString& ConnectionFile, int32 VramBudgetMiB)
{
	if (Launcher)
	{
		ReportError(TEXT("launch_failed"), TEXT("LaunchDaemon: this subsystem already supervises a daemon"));
		return false;
	}
	const FString Exe = Executable.IsEmpty() ? DefaultDaemonExecutable() : Executable;
	if (!FPaths::FileExists(Exe))
	{
		ReportError(TEXT("launch_failed"), FString::Printf(TEXT("no daemon executable at %s (stage the bundle: docs/unreal.md)"), *Exe));
		return false;
	}
	const FString File = ConnectionFile.IsEmpty() ? DefaultConnectionFile() : ConnectionFile;
	igi::DaemonLauncherOptions Options;
	Options.executable = TCHAR_TO_UTF8(*Exe);
	Options.connection_file = TCHAR_TO_UTF8(*File);
	if (FPaths::GetCleanFilename(Exe).StartsWith(TEXT("python"))) Options.executable_arguments = {"-m", "igi_sdk.daemon"};
	if (VramBudgetMiB >= 0) Options.arguments.insert(Options.arguments.end(), {"--vram-budget-mib", std::to_string(VramBudgetMiB)});
	Options.spawner = SpawnIgiDaemonProcess;
	Launcher = std::make_unique<igi::DaemonLauncher>(Options);
	TWeakObjectPtr<UIgiSubsystem> WeakThis(this);
	Launcher->SetOnReady([WeakThis](const igi::DaemonReady& Ready) {
		if (WeakThis.IsValid()) WeakThis->OnDaemonReady(Ready);
	});
	Launcher->SetOnFailed([WeakThis](const std::string& Message) {
		if (WeakThis.IsValid()) WeakThis->ReportError(TEXT("daemon_failed"), Utf8(Message));
	});
	Launcher->SetOnLog([](const igi::DaemonLogLine& Line) {
		const FString Text = Utf8(Line.text);
		if (Line.level == "error") UE_LOG(LogTemp, Error, TEXT("igi-daemon: %s"), *Text);
		else if (Line.level == "warning") UE_LOG(LogTemp, Warning, TEXT("igi-daemon: %s"), *Text);
		else UE_LOG(LogTemp, Log, TEXT("igi-daemon: %s"), *Text);
	});
	Launcher->Start();
	return true;
}

void UIgiSubsystem::OnDaemonReady(const igi::DaemonReady& Ready)
{
	// A restarted daemon has a new endpoint and key: drop the old client and connect to the new file now.
	Connecting.reset();
	DropClient();
	bRestorePending = Ready.restart > 0;
	ConnectWhenReady(Utf8(Launcher ? Launcher->options().connection_file : std::string()), 10.f);
	TryConnect();
}

void UIgiSubsystem::DropClient()
{
	// Close fails what was outstanding with the old daemon; the pump delivers those errors, so the NPCs waiting on
	// them are free to speak again (destroying the client with them queued would leave the NPCs busy for good).
	Driver.reset();
	if (Client)
	{
		Client->Close();
		Client->Pump();
		Client.reset();
	}
}

FString UIgiSubsystem::SaveSession(const FString& SaveKey, const FString& SessionId, const FString& Path)
{
	if (!IsConnected())
	{
		ReportError(TEXT("not_connected"), TEXT("SaveSession: not connected to the daemon"));
		return FString();
	}
	try
	{
		std::optional<std::string> File;
		if (!Path.IsEmpty()) File = std::string(TCHAR_TO_UTF8(*Path));
		return Utf8(SaveBook.Save(*Client, TCHAR_TO_UTF8(*SaveKey), TCHAR_TO_UTF8(*SessionId), File));
	}
	catch (const igi::IgiError& E)
	{
		ReportError(Utf8(E.kind()), Utf8(E.what()));
	}
	catch (const std::invalid_argument& E)
	{
		ReportError(TEXT("invalid_request"), Utf8(E.what()));
	}
	return FString();
}

void UIgiSubsystem::ConnectWhenReady(const FString& ConnectionFile, float TimeoutSeconds)
{
	Connecting.reset();  // a connect under way gives way to this one
	PendingConnectionFile = ConnectionFile.IsEmpty() ? DefaultConnectionFile() : ConnectionFile;
	ConnectDeadlineSeconds = FPlatformTime::Seconds() + TimeoutSeconds;
	FailedConnectionFileStamp = FDateTime::MinValue();
	NextConnectSeconds = 0.0;
}

bool UIgiSubsystem::IsConnected() const { return Client && Client->connected(); }

void UIgiSubsystem::SetVramBudgetMiB(int32 VramBudgetMiB)
{
	if (!Budget) Budget = std::make_unique<igi::FrameBudget>(BudgetOptions);
	Budget->SetBudgetOverride(static_cast<std::int64_t>(FMath::Max(0, VramBudgetMiB)));
}

void UIgiSubsystem::DeclareVramBudgetLevels(const TArray<int32>& LevelsMiB)
{
	if (!Budget) Budget = std::make_unique<igi::FrameBudget>(BudgetOptions);
	std::vector<std::int64_t> Levels;
	Levels.reserve(LevelsMiB.Num());
	for (int32 Level : LevelsMiB) Levels.push_back(static_cast<std::int64_t>(FMath::Max(0, Level)));
	Budget->DeclareBudgetLevels(std::move(Levels));
}

void UIgiSubsystem::ClearVramBudgetOverride()
{
	if (Budget) Budget->SetBudgetOverride(std::nullopt);
}

void UIgiSubsystem::SetTargetFrameTimeMs(float TargetFrameTimeMs)
{
	BudgetOptions.target_frame_time_ms = TargetFrameTimeMs;
	if (Budget) Budget->SetTargetFrameTimeMs(TargetFrameTimeMs);  // the live helper's copy too
}

void UIgiSubsystem::SetBusyFrameTimeMs(float InBusyFrameTimeMs) { GameBusyFrameTimeMs = InBusyFrameTimeMs; }

void UIgiSubsystem::ReportError(const FString& Code, const FString& Message)
{
	UE_LOG(LogTemp, Warning, TEXT("IGI: %s: %s"), *Code, *Message);
	OnError.Broadcast(Code, Message);
}

void UIgiSubsystem::TryConnect()
{
	if (Connecting || FPlatformTime::Seconds() < NextConnectSeconds) return;
	if (!FPaths::FileExists(PendingConnectionFile))
	{
		if (FPlatformTime::Seconds() > ConnectDeadlineSeconds)
		{
			ReportError(TEXT("timeout"), FString::Printf(TEXT("no connection file at %s"), *PendingConnectionFile));
			PendingConnectionFile.Reset();
		}
		return;
	}
	// A file a connect found stale (its daemon is gone) is tried again only once rewritten, by a daemon that starts.
	const FDateTime Stamp = IFileManager::Get().GetTimeStamp(*PendingConnectionFile);
	if (Stamp == FailedConnectionFileStamp)
	{
		if (FPlatformTime::Seconds() > ConnectDeadlineSeconds) PendingConnectionFile.Reset();  // reported already
		return;
	}
	// The handshake (a hello: up to 1 s on a stale file, up to connect_timeout_s otherwise) and the restores (one
	// load_session per save) run off the game thread; PollConnect installs what they give.
	ConnectingFile = PendingConnectionFile;
	ConnectingStamp = Stamp;
	PendingConnectionFile.Reset();
	Connecting = std::make_unique<igi::ConnectTask>(std::string(TCHAR_TO_UTF8(*ConnectingFile)), igi::ClientOptions{},
	                                                bRestorePending ? &SaveBook : nullptr);
}

void UIgiSubsystem::PollConnect()
{
	if (!Connecting) return;
	std::optional<igi::ConnectOutcome> Outcome = Connecting->Poll();
	if (!Outcome) return;
	Connecting.reset();
	if (Outcome->error)
	{
		FString Kind = TEXT("error");
		try
		{
			std::rethrow_exception(Outcome->error);
		}
		catch (const igi::IgiError& E)
		{
			Kind = Utf8(E.kind());
			ReportError(Kind, Utf8(E.what()));
		}
		if (FPlatformTime::Seconds() <= ConnectDeadlineSeconds)
		{
			PendingConnectionFile = ConnectingFile;  // still waiting
			if (Kind == TEXT("stale_connection_file")) FailedConnectionFileStamp = ConnectingStamp;  // for a new file
			else NextConnectSeconds = FPlatformTime::Seconds() + 2.0;  // the same daemon, once more
		}
		return;
	}
	Install(std::move(*Outcome));
}

void UIgiSubsystem::Install(igi::ConnectOutcome Outcome)
{
	DropClient();  // a client connected before (ConnectWhenReady called again): its driver goes with it, first
	Client = std::move(Outcome.client);
	ConnectedFile = ConnectingFile;
	if (!Budget) Budget = std::make_unique<igi::FrameBudget>(BudgetOptions);
	Driver = std::make_unique<igi::FrameBudgetDriver>(*Client, *Budget);
	TWeakObjectPtr<UIgiSubsystem> WeakThis(this);
	Driver->SetOnError([WeakThis](const igi::IgiError& E) {
		if (WeakThis.IsValid()) WeakThis->ReportError(Utf8(E.kind()), Utf8(E.what()));
	});
	Driver->SetOnBudgetAck([WeakThis](const igi::BudgetAck& Ack) {
		if (WeakThis.IsValid()) WeakThis->OnBudgetAck.Broadcast(static_cast<int32>(Ack.requested_mib), static_cast<int32>(Ack.granted_mib));
	});
	Client->SetOnDisconnected([WeakThis](const igi::IgiError& E) {
		if (WeakThis.IsValid()) WeakThis->ReportError(Utf8(E.kind()), Utf8(E.what()));
	});
	bRestorePending = false;
	for (const auto& Entry : Outcome.restored.restored)
	{
		OnSessionRestored.Broadcast(Utf8(Entry.first), Utf8(Entry.second.session_id));
	}
	for (const auto& Entry : Outcome.restored.failed) ReportError(TEXT("restore_failed"), Utf8(Entry.first + ": " + Entry.second));
	OnConnected.Broadcast();
}

void UIgiSubsystem::Tick(float DeltaTime) { PumpOncePerFrame(DeltaTime); }

void UIgiSubsystem::PumpOncePerFrame(float DeltaSeconds)
{
	if (LastPumpedFrame == GFrameCounter) return;
	LastPumpedFrame = GFrameCounter;
	// The frame's busy time, not the vsync-locked interval (at the target rate that sits inside the governor's band, so
	// a throttle never relaxes): the game's own, else stat unit's Game, Draw and GPU times (of the frame before).
	const double FrameMs = GameBusyFrameTimeMs >= 0.f
		? GameBusyFrameTimeMs
		: igi::BusyFrameTimeMs(FPlatformTime::ToMilliseconds(GGameThreadTime), FPlatformTime::ToMilliseconds(GRenderThreadTime),
		                       FPlatformTime::ToMilliseconds(RHIGetGPUFrameCycles()), DeltaSeconds * 1000.0);
	GameBusyFrameTimeMs = -1.f;
	if (Launcher) Launcher->Pump();  // OnDaemonReady (connects), the daemon's log
	if (!PendingConnectionFile.IsEmpty()) TryConnect();
	PollConnect();
	if (!Client) return;
	if (Driver) Driver->Tick(FrameMs, FPlatformTime::Seconds());
	// Throttle advice: the client applies tokens_per_frame (at most that many callbacks this frame, SIZE_MAX
	// without a cap); the daemon applies sleep_ms_between_tokens itself.
	Client->Pump(Budget ? Budget->PumpBudget() : SIZE_MAX);
	if (!Client->connected() && !Connecting && PendingConnectionFile.IsEmpty())
	{
		// The client declared the daemon gone (silent past client_timeout_s: a debugger pause, a suspend, a stall)
		// and refuses every request from now on. Connect a new client: to the same daemon once it answers again,
		// else to the one the launcher restarts (its OnDaemonReady takes over then).
		const FString File = ConnectedFile;
		DropClient();
		if (!File.IsEmpty()) ConnectWhenReady(File, 120.f);
	}
}
