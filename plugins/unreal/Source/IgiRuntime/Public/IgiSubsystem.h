// IgiSubsystem.h - IgiRuntime (Unreal wrapper): owns the one igi::Client of a game instance.
//
// Connects to the daemon named by a connection file, pumps the client's callback queue once per
// frame on the game thread, and feeds frame times to the frame-rate budget helper
// (igi::FrameBudget), which reports frame_stats, applies the daemon's throttle advice and sends
// budget changes (an explicit SetVramBudgetMiB override always wins).
#pragma once

#include <memory>

#include "CoreMinimal.h"
#include "HAL/PlatformProcess.h"
#include "Subsystems/GameInstanceSubsystem.h"
#include "Tickable.h"
#include "igi/client.hpp"
#include "igi/connect_task.hpp"
#include "igi/daemon_launcher.hpp"
#include "igi/frame_budget.hpp"

#include "IgiSubsystem.generated.h"

DECLARE_DYNAMIC_MULTICAST_DELEGATE(FIgiOnConnected);
DECLARE_DYNAMIC_MULTICAST_DELEGATE_TwoParams(FIgiOnSubsystemError, const FString&, Code, const FString&, Message);
DECLARE_DYNAMIC_MULTICAST_DELEGATE_TwoParams(FIgiOnBudgetAck, int32, RequestedMiB, int32, GrantedMiB);
DECLARE_DYNAMIC_MULTICAST_DELEGATE_TwoParams(FIgiOnSessionRestored, const FString&, SaveKey, const FString&, SessionId);

UCLASS()
class IGIRUNTIME_API UIgiSubsystem : public UGameInstanceSubsystem, public FTickableGameObject
{
	GENERATED_BODY()

public:
	virtual void Initialize(FSubsystemCollectionBase& Collection) override;
	virtual void Deinitialize() override;

	// FTickableGameObject
	virtual void Tick(float DeltaTime) override;
	virtual TStatId GetStatId() const override;
	virtual bool IsTickable() const override { return !IsTemplate(); }
	virtual ETickableTickType GetTickableTickType() const override { return ETickableTickType::Conditional; }

	/** Starts the daemon and supervises it: `Executable --connection-file File --port 0 --exit-with-pid <game pid>
	 *  [--vram-budget-mib N]` (N < 0: daemon default; the daemon exits when the game's process is gone). An empty
	 *  Executable is the bundle staged with the plugin (DefaultDaemonExecutable); a Python interpreter (file name
	 *  starting with "python") gets `-m igi_sdk.daemon` first. Connects when the connection file appears, restarts
	 *  the daemon with backoff when it dies (then reconnects and reopens the sessions saved with SaveSession), and
	 *  stops it in Deinitialize. */
	UFUNCTION(BlueprintCallable, Category = "IGI")
	bool LaunchDaemon(const FString& Executable, const FString& ConnectionFile, int32 VramBudgetMiB = -1);

	/** Saves a session (Path empty: the daemon's session folder) and records it under SaveKey, to reopen it after a
	 *  daemon restart (OnSessionRestored). Blocking; returns the file written, empty on failure (OnError says why). */
	UFUNCTION(BlueprintCallable, Category = "IGI")
	FString SaveSession(const FString& SaveKey, const FString& SessionId, const FString& Path);

	/** The daemon bundle staged with the plugin: <Plugin>/Binaries/IgiDaemon/<Platform>/igi-daemon/igi-daemon[.exe]. */
	static FString DefaultDaemonExecutable();

	/** Waits (without blocking frames) for the connection file, then connects; empty = default path. A file a connect
	 *  failed on (a daemon that has gone) is tried again once rewritten, until TimeoutSeconds. */
	UFUNCTION(BlueprintCallable, Category = "IGI")
	void ConnectWhenReady(const FString& ConnectionFile, float TimeoutSeconds = 120.f);

	UFUNCTION(BlueprintPure, Category = "IGI")
	bool IsConnected() const;

	/** Explicit VRAM budget (MiB) that overrides the daemon's proposals; sent on the next frame. */
	UFUNCTION(BlueprintCallable, Category = "IGI")
	void SetVramBudgetMiB(int32 VramBudgetMiB);

	/** Protocol 1.3: the VRAM budgets (MiB) the game will ask for, e.g. menu 6144, play 2048, cutscene 0 (at most 16),
	 *  which the daemon plans ahead so that a later change to one of them needs no planning. Sent with the next budget
	 *  request (or with the budget in force); an empty array clears them. */
	UFUNCTION(BlueprintCallable, Category = "IGI")
	void DeclareVramBudgetLevels(const TArray<int32>& LevelsMiB);

	/** Lets the daemon's proposals drive the budget again. */
	UFUNCTION(BlueprintCallable, Category = "IGI")
	void ClearVramBudgetOverride();

	/** Frame time the game aims for, reported in frame_stats (default 16.67 ms); applies from the next report. */
	UFUNCTION(BlueprintCallable, Category = "IGI")
	void SetTargetFrameTimeMs(float TargetFrameTimeMs);

	/** This frame's busy time (ms) as the game measures it, reported instead of the engine's thread times (by default
	 *  the longest of stat unit's Game, Draw and GPU; the frame interval when the engine gives none). Call it each
	 *  frame before the subsystem ticks; it holds for one frame. */
	UFUNCTION(BlueprintCallable, Category = "IGI")
	void SetBusyFrameTimeMs(float BusyFrameTimeMs);

	UPROPERTY(BlueprintAssignable, Category = "IGI")
	FIgiOnConnected OnConnected;

	UPROPERTY(BlueprintAssignable, Category = "IGI")
	FIgiOnSubsystemError OnError;

	UPROPERTY(BlueprintAssignable, Category = "IGI")
	FIgiOnBudgetAck OnBudgetAck;

	/** A session saved with SaveSession was reopened on a restarted daemon (its new id). */
	UPROPERTY(BlueprintAssignable, Category = "IGI")
	FIgiOnSessionRestored OnSessionRestored;

	/** Feeds the frame's busy time to the budget helper (DeltaSeconds, the interval, only when no busy time is
	 *  known) and runs queued client callbacks; only the first call of a frame does work (components call it from
	 *  TickComponent, the subsystem from Tick). */
	void PumpOncePerFrame(float DeltaSeconds);

	/** The connected client, or nullptr. Game thread only. */
	igi::Client* GetClient() const { return Client && Client->connected() ? Client.get() : nullptr; }

	/** The default connection file: -IgiConnectionFile=, else $IGI_CONNECTION_FILE, else Saved/Igi/connection.json. */
	static FString DefaultConnectionFile();

private:
	void TryConnect();
	void PollConnect();
	void Install(igi::ConnectOutcome Outcome);
	void DropClient();
	void ReportError(const FString& Code, const FString& Message);
	void OnDaemonReady(const igi::DaemonReady& Ready);

	std::unique_ptr<igi::Client> Client;
	std::unique_ptr<igi::FrameBudget> Budget;
	std::unique_ptr<igi::FrameBudgetDriver> Driver;
	igi::FrameBudgetOptions BudgetOptions;
	float GameBusyFrameTimeMs = -1.f;  // SetBusyFrameTimeMs for this frame; negative: none
	FString PendingConnectionFile;
	double ConnectDeadlineSeconds = 0.0;
	FDateTime FailedConnectionFileStamp;  // the file a connect found stale: tried again once it is rewritten
	double NextConnectSeconds = 0.0;      // after another failure (a daemon too slow to answer): the next try
	std::unique_ptr<igi::ConnectTask> Connecting;  // the handshake (and restores) under way, off the game thread
	FString ConnectingFile;
	FDateTime ConnectingStamp;
	FString ConnectedFile;  // the file of the client in use: reconnected to after the daemon was declared gone
	uint64 LastPumpedFrame = MAX_uint64;
	std::unique_ptr<igi::DaemonLauncher> Launcher;  // the daemon this subsystem started, if any
	igi::SessionSaveBook SaveBook;
	bool bRestorePending = false;
};
