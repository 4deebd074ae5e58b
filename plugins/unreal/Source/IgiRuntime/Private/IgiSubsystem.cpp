// IgiSubsystem.cpp - IgiRuntime (Unreal wrapper): client lifetime, connection, per-frame pump.
#include "IgiSubsystem.h"

#include "HAL/PlatformMisc.h"
#include "HAL/PlatformTime.h"
#include "Misc/CommandLine.h"
#include "Misc/Parse.h"
#include "Misc/Paths.h"

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
	Driver.reset();  // forgets its in-flight requests before the client goes
	Budget.reset();
	if (Client && Client->connected() && DaemonProcess.IsValid())
	{
		try
		{
			// We started this daemon, so we stop it: it cancels work, frees memory and exits.
			Client->Call<igi::ShutdownRequest, igi::ShutdownReply>(igi::ShutdownRequest{}, std::nullopt, 5.0);
		}
		catch (const igi::IgiError& E)
		{
			UE_LOG(LogTemp, Warning, TEXT("IGI: shutdown_request failed: %s"), UTF8_TO_TCHAR(E.what()));
		}
	}
	if (Client)
	{
		Client->Close();
		Client.reset();
	}
	if (DaemonProcess.IsValid())
	{
		FPlatformProcess::CloseProc(DaemonProcess);
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

bool UIgiSubsystem::LaunchDaemon(const FString& PythonExecutable, const FString& ConnectionFile, int32 VramBudgetMiB)
{
	const FString File = ConnectionFile.IsEmpty() ? DefaultConnectionFile() : ConnectionFile;
	FString Args = FString::Printf(TEXT("-m igi_sdk.daemon --connection-file \"%s\""), *File);
	if (VramBudgetMiB >= 0) Args += FString::Printf(TEXT(" --vram-budget-mib %d"), VramBudgetMiB);
	DaemonProcess = FPlatformProcess::CreateProc(*PythonExecutable, *Args, true, true, true, nullptr, 0, nullptr, nullptr);
	if (!DaemonProcess.IsValid())
	{
		ReportError(TEXT("launch_failed"), FString::Printf(TEXT("cannot start %s %s"), *PythonExecutable, *Args));
		return false;
	}
	ConnectWhenReady(File, 180.f);
	return true;
}

void UIgiSubsystem::ConnectWhenReady(const FString& ConnectionFile, float TimeoutSeconds)
{
	PendingConnectionFile = ConnectionFile.IsEmpty() ? DefaultConnectionFile() : ConnectionFile;
	ConnectDeadlineSeconds = FPlatformTime::Seconds() + TimeoutSeconds;
}

bool UIgiSubsystem::IsConnected() const { return Client && Client->connected(); }

void UIgiSubsystem::SetVramBudgetMiB(int32 VramBudgetMiB)
{
	if (!Budget) Budget = std::make_unique<igi::FrameBudget>(BudgetOptions);
	Budget->SetBudgetOverride(static_cast<std::int64_t>(FMath::Max(0, VramBudgetMiB)));
}

void UIgiSubsystem::ClearVramBudgetOverride()
{
	if (Budget) Budget->SetBudgetOverride(std::nullopt);
}

void UIgiSubsystem::SetTargetFrameTimeMs(float TargetFrameTimeMs)
{
	BudgetOptions.target_frame_time_ms = TargetFrameTimeMs;
}

void UIgiSubsystem::ReportError(const FString& Code, const FString& Message)
{
	UE_LOG(LogTemp, Warning, TEXT("IGI: %s: %s"), *Code, *Message);
	OnError.Broadcast(Code, Message);
}

void UIgiSubsystem::TryConnect()
{
	if (!FPaths::FileExists(PendingConnectionFile))
	{
		if (FPlatformTime::Seconds() > ConnectDeadlineSeconds)
		{
			ReportError(TEXT("timeout"), FString::Printf(TEXT("no connection file at %s"), *PendingConnectionFile));
			PendingConnectionFile.Reset();
		}
		return;
	}
	const FString File = PendingConnectionFile;
	PendingConnectionFile.Reset();
	try
	{
		// The daemon writes the file once it serves, so this hello round trip is short.
		Client = igi::Client::FromConnectionFile(std::string(TCHAR_TO_UTF8(*File)));
		Client->Connect();
	}
	catch (const igi::IgiError& E)
	{
		Client.reset();
		ReportError(Utf8(E.kind()), Utf8(E.what()));
		return;
	}
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
	OnConnected.Broadcast();
}

void UIgiSubsystem::Tick(float DeltaTime) { PumpOncePerFrame(DeltaTime); }

void UIgiSubsystem::PumpOncePerFrame(float DeltaSeconds)
{
	if (LastPumpedFrame == GFrameCounter) return;
	LastPumpedFrame = GFrameCounter;
	if (!PendingConnectionFile.IsEmpty()) TryConnect();
	if (!Client) return;
	if (Driver) Driver->Tick(DeltaSeconds * 1000.0, FPlatformTime::Seconds());
	// Throttle advice: the client applies tokens_per_frame (at most that many callbacks this frame, SIZE_MAX
	// without a cap); the daemon applies sleep_ms_between_tokens itself.
	Client->Pump(Budget ? Budget->PumpBudget() : SIZE_MAX);
}
